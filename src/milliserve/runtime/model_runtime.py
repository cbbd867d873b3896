"""One loaded model version: its backend instances, batcher, statistics and warmup."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.backends.base import Backend, BackendInfo
from milliserve.backends.onnxruntime import OnnxRuntimeBackend, parse_ort_options
from milliserve.cache.response_cache import CacheFactory, ResponseCache, cache_key
from milliserve.config.model_config import ModelConfig, WarmupInput, WarmupSpec, config_path
from milliserve.errors import (
    BackendError,
    ConfigError,
    DeadlineUnmeetableError,
    InvalidInputError,
    MilliserveError,
    QueueFullError,
    QueueTimeoutError,
    RequestError,
    UnavailableError,
)
from milliserve.features.store import FeatureSet
from milliserve.features.tokenize import TokenizerStep
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor
from milliserve.repository.autocomplete import complete_config
from milliserve.runtime.adaptive import AdaptiveBatching
from milliserve.runtime.batcher import Batcher, BatchPolicy, QueuedRequest
from milliserve.runtime.deadline import LatencyEstimator, request_deadline
from milliserve.runtime.executor import Executor, InstanceWorker
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import model_io, validate_request

__all__ = ["MODEL_FILENAME", "ModelRuntime", "failure_reason", "model_metadata"]

log = logging.getLogger(__name__)
MODEL_FILENAME = "model.onnx"
# Models faster than this (single-threaded) share the event loop's CPU.
COLOCATE_BELOW_S = 100e-6
Arrays = dict[str, np.ndarray[Any, Any]]


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, RequestError):
        return "REJECTED"
    if isinstance(exc, QueueFullError):
        return "QUEUE_FULL"
    if isinstance(exc, QueueTimeoutError):
        return "TIMEOUT"
    if isinstance(exc, DeadlineUnmeetableError):
        return "DEADLINE"
    if isinstance(exc, UnavailableError):
        return "UNAVAILABLE"
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    return "BACKEND"


def _policy(cfg: ModelConfig, label: str) -> BatchPolicy:
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
    return WarmupSpec(
        name="auto",
        inputs={t.name: WarmupInput(data_type=t.data_type, dims=t.dims, zero_data=True) for t in cfg.input},
    )


class ModelRuntime:
    """A model version that is loaded, warmed up and accepting requests."""

    def __init__(
        self,
        config: ModelConfig,
        version: str,
        backends: list[Backend],
        info: BackendInfo,
        executor: Executor,
    ) -> None:
        self.config = config
        self.version = version
        self.info = info
        self.label = f"{config.name}:{version}"
        self._backends = backends
        self._executor = executor
        self.io = model_io(config)
        self._output_names = [t.name for t in config.output]
        # Opt-in, for models that run in microseconds: run on the event loop thread and skip
        # the thread hand-off (~50 µs on a 2-vCPU VM), at the price of blocking the loop.
        self._inline = config.flag("inline_execution")
        self.policy = _policy(config, config.name)
        self.batcher = Batcher(self.policy, self._run_batch, len(backends))
        self._workers: list[InstanceWorker] = []
        self.colocated = False  # whether its workers share the event loop's CPU (set by load)
        self.stats = ModelStats(config.name, version, pending=self.batcher.pending)
        self.cache: ResponseCache | None = None  # set by load() when response_cache is enabled
        self.features: FeatureSet | None = None  # set by load() when the config declares features
        self.tokenizer: TokenizerStep | None = None  # set by load() for raw-text models
        self.estimator = LatencyEstimator()
        self._instances = len(backends)
        self._budget_s = config.budget.p99_ms / 1000 if config.budget is not None else None
        # deadline bookkeeping (estimates, late checks) starts with the first request that
        # has a deadline: requests without one pay nothing for it
        self._deadlines = self._budget_s is not None
        db = config.dynamic_batching
        self.adaptive = (
            AdaptiveBatching(self.batcher, self.policy, db.target_p99_ms / 1000)
            if db is not None and db.target_p99_ms
            else None
        )
        if self.adaptive is not None:
            tuned = self.adaptive
            self.stats.batching = lambda: (
                tuned.batcher.policy.max_batch_size,
                tuned.batcher.policy.max_queue_delay_s,
            )

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
        model_path = version_dir / MODEL_FILENAME
        where = str(config_path(version_dir.parent))
        if not model_path.is_file():
            raise ConfigError(f"{version_dir}: no {MODEL_FILENAME} in this version directory")
        t0 = time.perf_counter()
        probe = config or ModelConfig(name=name)
        try:
            options = parse_ort_options(probe)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        count = probe.instance_count
        backends: list[Backend] = []
        for _ in range(count):
            backends.append(await executor.run_load(OnnxRuntimeBackend, model_path, options))
        info = backends[0].info()
        final = complete_config(config, name, info, where)
        try:
            runtime = cls(final, version, backends, info, executor)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        feeds = await runtime._warmup()
        runtime.stats.record_load(load_s, time.perf_counter() - t1)
        if final.features is not None:
            c = caches or CacheFactory()
            model_inputs = {t.name for t in final.input}
            runtime.features = FeatureSet.from_config(
                final.features,
                model_inputs,
                version_dir.parent,
                c.redis_url,
                final.stage_budget_s("features") or c.timeout_s,  # Redis waits no longer than its stage
                c.backoff_s,
            )
        tk = final.tokenizer
        if tk is not None:
            runtime.tokenizer = TokenizerStep(
                version_dir.parent / tk.file, tk.text_input, tk.ids, tk.mask, tk.max_length
            )
        rc = final.response_cache
        if rc is not None and rc.enable:
            runtime.cache = (caches or CacheFactory()).make(rc.enable, rc.backend, rc.ttl_s, rc.max_bytes)
            if runtime.cache is not None:
                runtime.stats.cache_enabled = True
                runtime.stats.cache_errors = lambda: dict(runtime.cache.stats.errors) if runtime.cache else {}
        # A model that runs in microseconds on one thread shares the event loop's CPU: the
        # hand-off to its worker then needs no cross-CPU wake-up (see docs/design.md).
        compute_s = await runtime._probe_compute(feeds) if feeds is not None else None
        colocate = compute_s is not None and compute_s < COLOCATE_BELOW_S and options.intra_op_threads == 1
        runtime.colocated = colocate and executor.loop_cpu is not None
        runtime.estimator.prior_s = compute_s
        runtime._workers = [executor.worker(f"{name}:{version}:{i}", colocate=colocate) for i in range(count)]
        await runtime.batcher.start()
        log.info(
            "loaded %s version %s in %.3fs (warmup %.3fs, %d instance(s), compute %s%s)",
            name,
            version,
            load_s,
            runtime.stats.warmup_s,
            count,
            "unknown" if compute_s is None else f"{compute_s * 1e6:.0f} µs",
            ", sharing the event loop's CPU" if runtime.colocated else "",
        )
        return runtime

    async def _probe_compute(self, feeds: Arrays) -> float | None:
        """The fastest of a few runs of the warmup inputs (None when the model is slow)."""
        backend, outputs = self._backends[0], self._output_names

        def fastest() -> float:
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                backend.run(feeds, outputs)
                best = min(best, time.perf_counter() - t0)
                if best > COLOCATE_BELOW_S * 10:  # clearly not a microsecond model
                    break
            return best

        return await self._executor.run_load(fastest)

    async def _warmup(self) -> Arrays | None:
        """Run the warmup requests; returns inputs that ran, or None when none did."""
        explicit = bool(self.config.model_warmup)
        specs = self.config.model_warmup or (_default_warmup(self.config),)
        rng = np.random.default_rng(0)
        batching = self.config.max_batch_size > 0
        first: Arrays | None = None
        for spec in specs:
            feeds = _warmup_inputs(spec, batching, rng)
            for backend in self._backends:
                for _ in range(spec.count):
                    try:
                        await self._executor.run_load(backend.run, feeds, self._output_names)
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
        """Finish queued and running requests, then release the instances."""
        await self.batcher.close(drain=True)
        if self.features is not None:
            await self.features.close()
        for w in self._workers:
            w.close()
        for b in self._backends:
            b.close()

    # ---- serving ----
    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, queue and answer one request."""
        t0 = time.perf_counter_ns()
        stages: dict[str, float] = {}
        notes: dict[str, Any] = {}
        try:
            if self.features is not None:
                notes = await self._fetch_features(request, stages)
            if self.tokenizer is not None:
                tp = time.perf_counter()
                request.inputs = self.tokenizer.apply(request.inputs)
                stages["preprocess"] = time.perf_counter() - tp
            batch_size, signature = validate_request(request, self.io)
            deadline = request_deadline(
                request.deadline, request.parameters, t0 / 1e9, self._budget_s, self.policy.delay_on_timeout
            )
            if deadline is not None:
                self._deadlines = True
                self._admit(deadline, batch_size)
            t1 = time.perf_counter_ns()
            stages["parse"] = (t1 - t0) / 1e9  # validation; the front-end adds its decoding
            if self.cache is None:
                outputs = await self._compute(request, batch_size, signature, stages, deadline)
            else:
                key = cache_key(self.config.name, self.version, request)
                outputs, hit = await self.cache.get_or_compute(
                    key, lambda: self._compute(request, batch_size, signature, stages, deadline)
                )
                elapsed = time.perf_counter_ns() - t1
                self.stats.record_cache(hit, elapsed)
                # lookup, store, or waiting on another request's identical computation
                stages["cache"] = max(
                    0.0, elapsed / 1e9 - stages.get("queue", 0.0) - stages.get("infer", 0.0)
                )
        except (MilliserveError, asyncio.CancelledError) as exc:
            self.stats.record_request(time.perf_counter_ns() - t0, failure_reason(exc))
            raise
        response = InferResponse(
            model_name=self.config.name,
            model_version=self.version,
            id=request.id,
            outputs=outputs,
            parameters=notes,
            timings=stages,
            record_stages=self.stats.record_stages,
        )
        self.stats.record_request(time.perf_counter_ns() - t0, None)
        return response

    async def _fetch_features(self, request: InferRequest, stages: dict[str, float]) -> dict[str, Any]:
        """Replace the entity ids by the model's feature input; returns notes for the response."""
        assert self.features is not None
        t = time.perf_counter()
        ids, inputs = self.features.entity_ids(request.inputs, request.parameters)
        tensor, notes = await self.features.assemble(ids)
        request.inputs = [*inputs, InferTensor(self.features.input, "FP32", tensor.shape, tensor)]
        stages["features"] = time.perf_counter() - t
        return notes

    def _admit(self, deadline: float, batch_size: int) -> None:
        """Refuse at once a request that cannot finish in time (HTTP 429, gRPC DEADLINE_EXCEEDED)."""
        b = self.batcher
        need = self.estimator.needed_s(
            batch_size, b.queued, b.free_instances, self._instances, max(1, b.policy.max_batch_size)
        )
        if need is None:
            return  # nothing known yet: admit
        queue, compute = need
        left = deadline - time.perf_counter()
        if queue + compute > left:
            raise DeadlineUnmeetableError(
                f"request to model {self.config.name!r} would miss its deadline: it needs about "
                f"{(queue + compute) * 1e3:.2f} ms (queue ~{queue * 1e3:.2f} ms + compute "
                f"~{compute * 1e3:.2f} ms) and has {max(left, 0.0) * 1e3:.2f} ms left; not run"
            )

    async def _compute(
        self,
        request: InferRequest,
        batch_size: int,
        signature: Any,
        stages: dict[str, float],
        deadline: float | None = None,
    ) -> list[InferTensor]:
        """Queue the request for the batcher and return the outputs it asked for. Records the
        ``queue`` stage (until an instance took it) and ``infer`` (from then until the result
        is back on the event loop, hand-offs included)."""
        params = request.parameters
        priority = self.policy.priority_index(params.get("priority"))
        timeout_s = self.policy.timeout_s(params.get("timeout"))
        future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
        item = QueuedRequest(
            {t.name: t.data for t in request.inputs}, batch_size, signature, future, priority
        )
        item.deadline = deadline
        outputs = await self.batcher.execute(item, timeout_s)
        stages["queue"] = item.dispatched - item.enqueued
        stages["infer"] = time.perf_counter() - item.dispatched
        if self.adaptive is not None:
            self.adaptive.observe(stages["queue"], stages["infer"])
        wanted = [o.name for o in request.outputs] if request.outputs else self._output_names
        specs = self.io.outputs
        return [InferTensor(n, specs[n].datatype, outputs[n].shape, outputs[n]) for n in wanted]

    def _execute(self, backend: Backend, batch: list[QueuedRequest]) -> tuple[list[Arrays], int, int, int]:
        """Runs in a worker thread: assemble, run, split. Returns per-request outputs and timings."""
        t0 = time.perf_counter_ns()
        if len(batch) == 1:
            feeds = batch[0].inputs
        else:
            feeds = {n: np.concatenate([it.inputs[n] for it in batch]) for n in batch[0].inputs}
        t1 = time.perf_counter_ns()
        outputs = backend.run(feeds, self._output_names)
        t2 = time.perf_counter_ns()
        if len(batch) == 1:
            per_item = [outputs]
        else:
            per_item = []
            start = 0
            for it in batch:
                end = start + it.batch_size
                per_item.append({n: a[start:end] for n, a in outputs.items()})
                start = end
        t3 = time.perf_counter_ns()
        return per_item, t1 - t0, t2 - t1, t3 - t2

    async def _run_batch(self, batch: list[QueuedRequest], index: int) -> None:
        started = time.perf_counter()
        late = (
            [it for it in batch if it.deadline is not None and it.deadline <= started]
            if self._deadlines
            else None
        )
        if late:  # already lost: answer them now and spend no compute on them
            for it in late:
                if not it.future.done():
                    it.future.set_exception(
                        DeadlineUnmeetableError(
                            f"request to model {self.config.name!r} reached its deadline while "
                            "queued; not run"
                        )
                    )
            gone = {id(it) for it in late}
            batch = [it for it in batch if id(it) not in gone]
            if not batch:
                return
        try:
            if self._inline:
                per_item, in_ns, infer_ns, out_ns = self._execute(self._backends[index], batch)
            else:
                per_item, in_ns, infer_ns, out_ns = await self._workers[index].run(
                    self._execute, self._backends[index], batch
                )
        except (BackendError, InvalidInputError) as exc:
            if len(batch) > 1:
                # Isolation: one request's data may break a batch (e.g. an out-of-range token id);
                # rerun them one by one so only the culprit fails.
                for it in batch:
                    await self._run_batch([it], index)
                return
            if isinstance(exc, BackendError):  # client data errors are the client's to see, not logs'
                log.warning("%s: %s", self.label, exc)
            if not batch[0].future.done():
                batch[0].future.set_exception(exc)
            return
        except Exception as exc:  # a bug, not a model failure: still answer every request
            log.exception("%s: unexpected error running a batch", self.label)
            err = BackendError(f"internal error running model {self.label!r}: {exc}")
            for it in batch:
                if not it.future.done():
                    it.future.set_exception(err)
            return
        if self._deadlines:
            self.estimator.observe(sum(it.batch_size for it in batch), time.perf_counter() - started)
        queue_ns = [int((it.dispatched - it.enqueued) * 1e9) for it in batch]
        self.stats.record_batch(sum(it.batch_size for it in batch), queue_ns, in_ns, infer_ns, out_ns)
        for it, outs in zip(batch, per_item, strict=True):
            if not it.future.done():
                it.future.set_result(outs)

    # ---- descriptions ----
    def client_inputs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, datatype, dims) of what a client sends: the model's inputs, less those the
        feature and tokenizer steps build, plus the entity ids and raw text they read."""
        cfg = self.config
        built: set[str] = set()
        extra: list[tuple[str, str, tuple[int, ...]]] = []
        if cfg.features is not None:
            built.add(cfg.features.input)
            if cfg.features.entity_input:
                extra.append((cfg.features.entity_input, BYTES, (1,)))
        if cfg.tokenizer is not None:
            built.update(n for n in (cfg.tokenizer.ids, cfg.tokenizer.mask) if n)
            extra.append((cfg.tokenizer.text_input, BYTES, (1,)))
        return [(t.name, t.data_type, t.dims) for t in cfg.input if t.name not in built] + extra

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        return model_metadata(self.config, versions, self.info.platform, self.client_inputs())


def model_metadata(
    config: ModelConfig, versions: list[str], platform: str, inputs: list[tuple[str, str, tuple[int, ...]]]
) -> dict[str, Any]:
    """OIP model metadata: ``inputs`` as (name, datatype, dims) are what a client sends."""
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(section: Any) -> list[dict[str, Any]]:
        return [{"name": n, "datatype": d, "shape": batch + list(dims)} for n, d, dims in section]

    return {
        "name": config.name,
        "versions": versions,
        "platform": platform,
        "inputs": tensors(inputs),
        "outputs": tensors((t.name, t.data_type, t.dims) for t in config.output),
    }
