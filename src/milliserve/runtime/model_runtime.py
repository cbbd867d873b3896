"""One loaded model version: its instances (from the backend registry), warmup, and the
road its requests walk.

The road is built once, here, from the config:

    deadline → [features] → [tokenize] → validate → [cache] → admit → batch/execute

Each is a small object in ``runtime/stages.py``, ``features/`` or ``runtime/batch_execute.py``;
nothing below branches on which features a model has.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.backends.base import Backend, BackendInfo
from milliserve.backends.registry import Instance, backend_for, expand_instances
from milliserve.cache.response_cache import CacheFactory
from milliserve.config.model_config import ModelConfig, WarmupInput, WarmupSpec, config_path
from milliserve.errors import BackendError, ConfigError, InvalidInputError
from milliserve.features.fetch import FetchFeatures
from milliserve.features.store import FeatureSet
from milliserve.features.tokenize import TokenizerStep
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.road import Around, Stage, Step, build_road
from milliserve.runtime.autocomplete import complete_config
from milliserve.runtime.batch_execute import BatchExecute
from milliserve.runtime.batch_policy import BatchPolicy
from milliserve.runtime.deadline import LatencyEstimator, request_deadline
from milliserve.runtime.executor import Executor
from milliserve.runtime.loop_turn import TurnItem
from milliserve.runtime.sequence_execute import SequenceExecute
from milliserve.runtime.servable import ClientInputs, RoadServable
from milliserve.runtime.soon import Soon
from milliserve.runtime.stages import Admit, Deadline, StepStage, Validate, cache_stage
from milliserve.runtime.stall import stall_injectors
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import Signature, model_io, validate_request
from milliserve.status import status_of

__all__ = ["COLOCATE_BELOW_S", "ModelRuntime", "batch_policy", "model_steps"]

log = logging.getLogger(__name__)
# Models faster than this (single-threaded) share the event loop's CPU.
COLOCATE_BELOW_S = 100e-6
Arrays = dict[str, np.ndarray[Any, Any]]


def batch_policy(cfg: ModelConfig, label: str) -> BatchPolicy:
    db = cfg.dynamic_batching
    if db is None:
        return BatchPolicy(label=label, max_batch_size=max(1, cfg.max_batch_size))
    qp = db.default_queue_policy
    return BatchPolicy(
        label=label,
        merge=True,
        max_batch_size=cfg.max_batch_size,
        preferred_batch_sizes=db.preferred_batch_size,
        max_queue_delay_s=db.max_queue_delay_microseconds / 1e6,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        max_queue_size=qp.max_queue_size,
        default_timeout_us=qp.default_timeout_microseconds,
        allow_timeout_override=qp.allow_timeout_override,
        delay_on_timeout=qp.timeout_action == "DELAY",
    )


def _warmup_inputs(spec: WarmupSpec, batching: bool, rng: np.random.Generator) -> Arrays:
    feeds: Arrays = {}
    for name, inp in spec.inputs.items():
        shape = ((spec.batch_size,) if batching else ()) + tuple(d if d > 0 else 1 for d in inp.dims)
        if inp.data_type == BYTES:
            feeds[name] = np.full(shape, b"", dtype=object)
        elif inp.random_data:
            feeds[name] = rng.random(shape).astype(oip_to_numpy(inp.data_type))
        else:
            feeds[name] = np.zeros(shape, dtype=oip_to_numpy(inp.data_type))
    return feeds


def _default_warmup(cfg: ModelConfig) -> WarmupSpec:
    implicit = cfg.sequence_batching.implicit_inputs() if cfg.sequence_batching is not None else ()
    tensors = [(t.name, t.data_type, t.dims) for t in cfg.input]
    tensors += [(t.name, t.datatype, t.dims) for t in implicit]  # control and state inputs
    return WarmupSpec(
        name="auto",
        inputs={n: WarmupInput(data_type=d, dims=dims, zero_data=True) for n, d, dims in tensors},
    )


def model_steps(config: ModelConfig, model_dir: Path, caches: CacheFactory, executor: Executor) -> list[Step]:
    """The steps in front of a model: features by entity id, then the tokenizer."""
    steps: list[Step] = []
    if config.features is not None:
        fs = FeatureSet.from_config(
            config.features,
            {t.name for t in config.input},
            model_dir,
            caches.redis_url,
            config.stage_budget_s("features") or caches.timeout_s,  # Redis waits no longer than its stage
            caches.backoff_s,
        )
        steps.append(FetchFeatures("features", fs))
    if config.tokenizer is not None:
        steps.append(TokenizerStep("tokenizer", config.tokenizer, model_dir, executor.offload))
    return steps


def _inline_mode(config: ModelConfig) -> str:
    raw = config.parameters.get("inline_execution", "auto").lower()
    return {"1": "true", "0": "false"}.get(raw, raw)


class ModelRuntime(RoadServable):
    """A model version that is loaded, warmed up and accepting requests."""

    def __init__(
        self,
        config: ModelConfig,
        version: str,
        backends: list[Backend],
        info: BackendInfo,
        instances: list[Instance],
        steps: list[Step],
        caches: CacheFactory,
        model_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.version = version
        self.info = info
        self.platform = info.platform
        self.label = f"{config.name}:{version}"
        self.instances = instances
        self.steps = steps
        self.io = model_io(config)
        self.stats = ModelStats(config.name, version)
        self.estimator = LatencyEstimator()
        db = config.dynamic_batching
        self.execute: BatchExecute | SequenceExecute
        self.colocated = False  # whether its workers share the event loop's CPU (set by load)
        self._express = False  # whether infer_now may answer (the plain road: set below)
        if config.sequence_batching is not None:  # a stateful model: the sequence batcher
            where = model_dir or Path(".")
            inline = _inline_mode(config)
            self.execute = SequenceExecute(config.name, config, where, backends, self.io, self.stats, inline)
            self.road = build_road(
                [Deadline(None), *(StepStage(s) for s in steps), Validate(self.io)], self.execute
            )
            return
        try:
            self.execute = BatchExecute(
                self.label,
                batch_policy(config, config.name),
                backends,
                self.io,
                self.stats,
                self.estimator,
                _inline_mode(config),
                db.target_p99_ms / 1000 if db is not None and db.target_p99_ms else None,
                inline_below_s=COLOCATE_BELOW_S,
                around_batch=stall_injectors(config),  # tests and benchmarks only
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.batcher = self.execute.batcher
        budget_s = config.budget.p99_ms / 1000 if config.budget is not None and config.budget.p99_ms else None
        rc = config.response_cache
        cache = caches.make(rc.enable, rc.backend, rc.ttl_s, rc.max_bytes) if rc is not None else None
        self._admit = Admit(config.name, self.estimator, self.batcher, len(backends), self.execute.reprobe)
        stages: list[Stage | Around] = [
            Deadline(budget_s, self.execute.policy.delay_on_timeout),
            *(StepStage(s) for s in steps),
            Validate(self.io),
            *cache_stage(cache, self.stats, config.name, version),
            self._admit,
        ]
        self.road = build_road(stages, self.execute)
        self._budget_s = budget_s
        # the express lane (infer_now) takes the plain road only: deadline, validation,
        # admission, an inline run (no pipeline steps in front, no cache around it)
        self._express = not steps and cache is None

    def _admitted(
        self, request: InferRequest, execute: BatchExecute, work: int, start: float
    ) -> tuple[int, Signature, float | None]:
        """The express lane's road before the run: validated, its deadline (or budget) set
        and admitted against it (``Admit.check``). Raises as the road's stages raise."""
        batch_size, signature = validate_request(request, self.io)
        deadline = request_deadline(
            request.deadline, request.parameters, start, self._budget_s, execute.policy.delay_on_timeout
        )
        if deadline is not None:
            self._admit.check(deadline, work)
        return batch_size, signature, deadline

    def infer_now(self, request: InferRequest) -> InferResponse | None:
        """The express lane (docs/design.md, "The express lane"): a request that would walk
        this model's road without waiting anywhere (no pipeline steps, no cache, nothing
        queued, an idle instance, a batch small enough to run inline, no parameters such as
        a priority or a sequence) is validated, admitted, run and counted here at once, as
        the road would, with none of the road's awaits, its call and queue objects, or its
        future. Errors are raised as the road raises them. None: take the road."""
        execute = self.execute
        if not self._express or request.parameters or request.trace is not None:
            return None
        assert isinstance(execute, BatchExecute)  # a sequence model has no express lane
        inputs = request.inputs
        work = 0
        for t in inputs:
            work += t.data.size
        if not execute.runs_now(work):
            return None
        t0 = time.perf_counter_ns()
        start = t0 / 1e9
        try:
            batch_size, _, _ = self._admitted(request, execute, work, start)
            t1 = time.perf_counter()
            outputs, infer_ns = execute.run_now({t.name: t.data for t in inputs}, batch_size, work)
            t2 = time.perf_counter()
        except BaseException as exc:
            self.stats.record_request(time.perf_counter_ns() - t0, status_of(exc).reason)
            raise
        stats = self.stats
        response = InferResponse(
            model_name=self.config.name,
            model_version=self.version,
            id=request.id,
            outputs=execute.tensors(request, outputs),
            timings={"parse": t1 - start, "queue": 0.0, "infer": t2 - t1},
            record_stages=stats.record_stages,
        )
        stats.record_alone(time.perf_counter_ns() - t0, infer_ns)
        return response

    def infer_soon(self, request: InferRequest) -> Soon[InferResponse] | None:
        """The express lane under load (docs/design.md, "The express lane"): a request that
        ``infer_now`` would not run at once because requests overlap (or a batch is forming
        in this loop turn) joins the turn's batch, which runs inline once the loop has read
        every ready socket (``LoopTurn.join``): concurrent clients share one run of
        the model, as the road's batcher would have them, without its tasks and futures.
        Validated and admitted here (errors raised as the road raises them); the response
        settles the returned ``Soon``. None: take the road."""
        execute = self.execute
        if not self._express or request.parameters or request.trace is not None:
            return None
        assert isinstance(execute, BatchExecute)
        inputs = request.inputs
        work = 0
        for t in inputs:
            work += t.data.size
        if not execute.turn.possible(work):
            return None
        t0 = time.perf_counter_ns()
        start = t0 / 1e9
        stats = self.stats
        try:
            batch_size, signature, deadline = self._admitted(request, execute, work, start)
        except BaseException as exc:
            stats.record_request(time.perf_counter_ns() - t0, status_of(exc).reason)
            raise
        soon: Soon[InferResponse] = Soon()
        t1 = time.perf_counter()

        def done(outputs: Arrays | BaseException, started: float) -> None:
            if isinstance(outputs, BaseException):
                stats.record_request(time.perf_counter_ns() - t0, status_of(outputs).reason)
                soon.settle(outputs)
                return
            t2 = time.perf_counter()
            try:
                tensors = execute.tensors(request, outputs)
            except Exception as exc:  # a bug: answered as the road answers one
                log.exception("%s: unexpected error splitting a turn's outputs", self.label)
                done(BackendError(f"internal error running model {self.label!r}: {exc}"), started)
                return
            response = InferResponse(
                model_name=self.config.name,
                model_version=self.version,
                id=request.id,
                outputs=tensors,
                timings={"parse": t1 - start, "queue": started - t1, "infer": t2 - started},
                record_stages=stats.record_stages,
            )
            stats.record_request(time.perf_counter_ns() - t0, None)
            soon.settle(response)

        inputs_of = {t.name: t.data for t in inputs}
        execute.turn.join(TurnItem(inputs_of, batch_size, signature, work, done, deadline, request.client))
        return soon

    # ---- loading ----
    @classmethod
    async def load(
        cls,
        config: ModelConfig | None,
        name: str,
        version: str,
        version_dir: Path,
        executor: Executor,
        caches: CacheFactory | None = None,
    ) -> ModelRuntime:
        """Create the instances, complete the config, warm up. Raises ConfigError or BackendError."""
        where = str(config_path(version_dir.parent))
        factory = backend_for(config, version_dir, where)
        model_path = version_dir / factory.model_filename
        if not model_path.is_file():
            raise ConfigError(f"{version_dir}: no {factory.model_filename} in this version directory")
        t0 = time.perf_counter()
        probe = config or ModelConfig(name=name)
        try:
            options = factory.options(probe)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        instances = expand_instances(probe, await executor.run_load(factory.gpu_available), where)
        backends: list[Backend] = []
        try:
            for inst in instances:
                backends.append(await executor.run_load(factory.create, model_path, options, inst))
            info = backends[0].info()
            final = complete_config(config, name, info, where)
            # the config in effect names what serves it, as Triton fills in platform and backend
            served = {"platform": final.platform or info.platform, "backend": final.backend or factory.name}
            final = final.model_copy(update=served)
            c = caches or CacheFactory()
            try:
                runtime = cls(
                    final,
                    version,
                    backends,
                    info,
                    instances,
                    model_steps(final, version_dir.parent, c, executor),
                    c,
                    version_dir.parent,
                )
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            load_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            feeds = await runtime._warmup(backends, executor)
        except BaseException:
            for b in backends:
                b.close()
            raise
        runtime.stats.record_load(load_s, time.perf_counter() - t1)
        # A model that runs in microseconds on one thread shares the event loop's CPU: the
        # hand-off to its worker then needs no cross-CPU wake-up (see docs/design.md).
        compute_s = await runtime._probe_compute(backends[0], feeds, executor) if feeds is not None else None
        threads = factory.threads(options)
        colocate = compute_s is not None and compute_s < COLOCATE_BELOW_S and threads == 1
        runtime.colocated = colocate and executor.loop_cpu is not None
        work = sum(a.size for a in feeds.values()) if feeds is not None else 1
        runtime.estimator.prior_s, runtime.estimator.prior_work = compute_s, float(max(work, 1))
        runtime.execute.probe_feeds = feeds
        workers = [executor.worker(f"{name}:{version}:{inst.name}", colocate=colocate) for inst in instances]
        await runtime.execute.start(workers, compute_s, work, threads)
        log.info(
            "loaded %s version %s in %.3fs (warmup %.3fs, %d instance(s), compute %s%s)",
            name,
            version,
            load_s,
            runtime.stats.warmup_s,
            len(instances),
            "unknown" if compute_s is None else f"{compute_s * 1e6:.0f} µs",
            ", inline"
            if runtime.execute.inline
            else ", sharing the event loop's CPU"
            if runtime.colocated
            else "",
        )
        return runtime

    async def _probe_compute(self, backend: Backend, feeds: Arrays, executor: Executor) -> float | None:
        """The fastest of a few runs of the warmup inputs."""
        outputs = list(self.io.outputs)

        def fastest() -> float:
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                backend.run(feeds, outputs)
                best = min(best, time.perf_counter() - t0)
                if best > COLOCATE_BELOW_S * 10:  # clearly not a microsecond model
                    break
            return best

        return await executor.run_load(fastest)

    async def _warmup(self, backends: list[Backend], executor: Executor) -> Arrays | None:
        """Run the warmup requests; returns inputs that ran, or None when none did."""
        explicit = bool(self.config.model_warmup)
        specs = self.config.model_warmup or (_default_warmup(self.config),)
        rng = np.random.default_rng(0)
        batching = self.config.max_batch_size > 0
        outputs = list(self.io.outputs)
        first: Arrays | None = None
        for spec in specs:
            feeds = _warmup_inputs(spec, batching, rng)
            for backend in backends:
                for _ in range(spec.count):
                    try:
                        await executor.run_load(backend.run, feeds, outputs)
                    except (BackendError, InvalidInputError) as exc:
                        if explicit:
                            raise BackendError(f"warmup {spec.name!r} failed: {exc}") from exc
                        # zeros are not valid input for every model; the automatic warmup is a courtesy
                        log.warning("automatic warmup of %s skipped: %s", self.label, exc)
                        return None
            if first is None:
                first = feeds
        return first

    async def close(self) -> None:
        """Finish queued and running requests, then release the instances and steps."""
        await self.execute.close()
        for step in self.steps:
            close = getattr(step, "close", None)
            if close is not None:
                await close()

    # ---- descriptions ----
    def client_inputs(self) -> ClientInputs:
        """(name, datatype, dims) of what a client sends: the model's inputs, less those the
        steps in front of it build, plus the entity ids and raw text those steps read."""
        built = {n for s in self.steps for n in s.makes}
        extra = [(n, BYTES, (1,)) for s in self.steps for n in s.needs]
        return [(t.name, t.data_type, t.dims) for t in self.config.input if t.name not in built] + extra
