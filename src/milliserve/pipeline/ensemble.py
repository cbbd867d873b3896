"""A pipeline (``platform: ensemble``): named tensors flow through a list of steps.

Its road is the model road's front half and a terminal that runs the steps:

    deadline → validate → [cache] → steps

Requests to a pipeline whose steps are all row-wise share runs of the steps
(``pipeline/batching.py``). Model steps go through the models' own roads, so concurrent
pipeline requests batch at each model, and the pipeline's deadline travels with them (a
step that cannot make it is refused, HTTP 429, before it computes). The time of every step lands in the
request's Server-Timing stages: features, preprocess, the models' queue / infer /
cache, ann (nearest-neighbour search), postprocess.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from milliserve.cache.response_cache import CacheFactory
from milliserve.config.model_config import ModelConfig, config_path
from milliserve.errors import BackendError, ConfigError, MilliserveError
from milliserve.features.fetch import FetchFeatures
from milliserve.features.store import FeatureSet
from milliserve.features.tokenize import TokenizerStep
from milliserve.pipeline.ann import AnnStep, tensor_dim
from milliserve.pipeline.batching import BatchedSteps, batching_wanted
from milliserve.pipeline.cascade import CascadeStep
from milliserve.pipeline.hedge import HedgedCall
from milliserve.pipeline.pooling import PoolingStep
from milliserve.pipeline.score import ScoreStep
from milliserve.pipeline.steps import ModelCall, PythonCall, RulesStep
from milliserve.road import Around, Call, Handler, Offload, Outputs, Stage, Step, Tensors, build_road
from milliserve.runtime.servable import RoadServable
from milliserve.runtime.stages import Deadline, Validate, cache_stage
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import model_io

__all__ = ["PipelineRuntime", "build_steps"]

GetModel = Callable[[str, str], Any]


def build_steps(
    config: ModelConfig,
    model_dir: Path,
    get_model: GetModel,
    caches: CacheFactory,
    offload: Offload | None = None,
) -> list[Step]:
    """The steps of ``config``, checked so that every tensor a step reads exists by then and
    every pipeline output is made. ``get_model`` returns a ready servable (dependencies are
    loaded first). Raises ConfigError naming the step."""
    assert config.ensemble_scheduling is not None
    where = config_path(model_dir)
    steps: list[Step] = []
    after_model = False
    redis_timeout = config.stage_budget_s("features") or caches.timeout_s
    for i, s in enumerate(config.ensemble_scheduling.step, 1):
        label = f"step {i} ({s.kind}{' ' + s.model_name if s.model_name else ''})"
        try:
            step: Step
            if s.model_name:
                rt = get_model(s.model_name, "" if s.model_version < 0 else str(s.model_version))
                # an optional input of the model (an embedding pipeline's token ids) is sent
                # only when the step maps it or this pipeline has a tensor of that name
                optional = (
                    {t.name for t in rt.config.input if t.optional}
                    - set(s.input_map)
                    - {t.name for t in config.input}
                )
                inputs = [n for n, _, _ in rt.client_inputs() if n not in optional]
                call = HedgedCall if s.hedge is not None else ModelCall
                step = call(label, s, inputs, [t.name for t in rt.config.output], get_model)
                after_model = True
            elif s.cascade is not None:
                step = CascadeStep(label, s, get_model)
                after_model = True
                named = s.cascade.answered_by
                declared = next((t.data_type for t in config.output if t.name == named), "BYTES")
                if declared != "BYTES":  # caught here, not as a 500 on every request
                    raise ConfigError(
                        f"answered_by {named!r} holds model names: declare it TYPE_STRING, not {declared}"
                    )
            elif s.tokenizer is not None:
                step = TokenizerStep(label, s.tokenizer, model_dir, offload)
            elif s.features is not None:
                fs = FeatureSet.from_config(
                    s.features,
                    {s.features.input},
                    model_dir,
                    caches.redis_url,
                    redis_timeout,
                    caches.backoff_s,
                )
                step = FetchFeatures(label, fs)
            elif s.ann is not None:
                dim = tensor_dim(config, i - 1, s.ann.input, get_model)
                step = AnnStep(label, s.ann, model_dir, dim, offload)
            elif s.rules is not None:
                step = RulesStep(label, s.rules)
            elif s.pooling is not None:
                step = PoolingStep(label, s.pooling)
            elif s.score is not None:
                step = ScoreStep(label, s.score)
            else:
                assert s.python is not None
                step = PythonCall(label, s.python, "postprocess" if after_model else "preprocess")
        except MilliserveError as exc:  # steps that name themselves are not named twice
            message = exc.message.removeprefix(f"{label}: ")
            raise ConfigError(f"{where}: {label}: {message}") from None
        steps.append(step)
    available = {t.name for t in config.input}
    for step in steps:
        missing = [n for n in step.needs if n not in available]
        if missing:
            raise ConfigError(
                f"{where}: {step.name} reads {missing}, which neither the pipeline's inputs nor an "
                f"earlier step provide (available: {sorted(available)})"
            )
        available.update(step.makes)
    unmade = [t.name for t in config.output if t.name not in available]
    if unmade:
        raise ConfigError(f"{where}: no step makes the pipeline outputs {unmade}")
    _length_buckets(steps, {t.name for t in config.output})
    return steps


def _length_buckets(steps: list[Step], outputs: set[str]) -> None:
    """Let a model step run a padded batch as length buckets (pipeline/buckets.py) where its
    inputs take any length, and its only output goes to a pooling step that reads the mask
    the model was given, and nowhere else, or that a score step reads and has no token axis
    (a cross-encoder's or a classifier's logits) from a model that reads the tokenizer's
    mask: there the padding cannot change an answer."""
    masks = {s.mask for s in steps if isinstance(s, TokenizerStep) and s.mask}
    for i, step in enumerate(steps):
        if type(step) is not ModelCall or len(step.makes) != 1:
            continue
        hidden = step.makes[0]
        readers = [s for s in steps[i + 1 :] if hidden in s.needs]
        rows = next((m for m in masks if step.masks_padding(m)), None)
        if rows is not None and any(isinstance(r, ScoreStep) for r in readers) and step.takes_any_length():
            step.buckets, step.rows_out = (rows, next(iter(step.outputs))), True
            continue
        pool = readers[0] if len(readers) == 1 else None
        if (
            isinstance(pool, PoolingStep)
            and hidden not in outputs
            and pool.config.input == hidden
            and pool.config.mode != "none"
            and pool.config.mask in step.needs
            and step.takes_any_length()
        ):
            step.buckets = (pool.config.mask, next(m for m, d in step.outputs.items() if d == hidden))


class RunSteps:
    """The terminal of a pipeline's road: each step in order over the named tensors."""

    def __init__(self, name: str, steps: list[Step], outputs: dict[str, str], stats: ModelStats) -> None:
        self.name, self.steps, self.outputs, self.stats = name, steps, outputs, stats

    async def __call__(self, call: Call) -> Outputs:
        request = call.request
        tensors: Tensors = {t.name: t for t in request.inputs}
        stages = call.stages
        if request.trace is not None:
            await self._traced(tensors, call)
        else:
            for step in self.steps:
                if step.stage:
                    start = time.perf_counter()
                    await step.run(tensors, call)
                    stages[step.stage] = stages.get(step.stage, 0.0) + time.perf_counter() - start
                else:  # a model step adds the model's own stages
                    await step.run(tensors, call)
        wanted = [o.name for o in request.outputs] if request.outputs else list(self.outputs)
        out = []
        for name in wanted:
            t = tensors[name]
            if t.datatype != self.outputs[name]:
                raise BackendError(
                    f"pipeline {self.name!r} output {name!r} is {t.datatype} but the config "
                    f"declares {self.outputs[name]}"
                )
            out.append(t)
        stats = self.stats
        stats.inference_count += call.batch_size
        stats.execution_count += 1
        stats.last_inference_ms = int(time.time() * 1000)  # wall clock: Triton reports epoch ms
        return out

    async def _traced(self, tensors: Tensors, call: Call) -> None:
        """The steps, each a span (a model step's holds the model's own spans)."""
        stages, log = call.stages, call.request.trace
        for step in self.steps:
            start = time.perf_counter()
            index = log.open(step.name, start, {"milliserve.stage": step.stage} if step.stage else None)
            try:
                await step.run(tensors, call)
            finally:
                end = time.perf_counter()
                log.close(index, end)
            if step.stage:
                stages[step.stage] = stages.get(step.stage, 0.0) + end - start


class PipelineRuntime(RoadServable):
    """One version of a pipeline: the same face to the data plane as a model."""

    platform = "ensemble"

    def __init__(self, config: ModelConfig, version: str, steps: list[Step], caches: CacheFactory) -> None:
        self.config = config
        self.version = version
        self.label = f"{config.name}:{version}"
        self.steps = steps
        self.io = model_io(config)
        self.stats = ModelStats(config.name, version)
        for step in steps:  # counters a step keeps (hedges, cascade rows) become metrics
            counts = getattr(step, "counts", None)
            if counts is not None:
                self.stats.step_counts[step.name] = counts
        outputs = {t.name: t.data_type for t in config.output}
        rc = config.response_cache
        cache = caches.make(rc.enable, rc.backend, rc.ttl_s, rc.max_bytes) if rc is not None else None
        budget_s = config.budget.p99_ms / 1000 if config.budget is not None and config.budget.p99_ms else None
        stages: list[Stage | Around] = [
            Deadline(budget_s),
            Validate(self.io),
            *cache_stage(cache, self.stats, config.name, version),
        ]
        run: Handler = RunSteps(config.name, steps, outputs, self.stats)
        self.batched: BatchedSteps | None = None
        if batching_wanted(config.parameters, config.max_batch_size, steps, list(outputs)):
            slots = max((s.instances() for s in steps if isinstance(s, ModelCall)), default=1)
            run = self.batched = BatchedSteps(self.label, run, config.max_batch_size, slots)
        self.road = build_road(stages, run)

    @classmethod
    async def load(
        cls,
        config: ModelConfig,
        version: str,
        model_dir: Path,
        get_model: GetModel,
        caches: CacheFactory | None = None,
        offload: Offload | None = None,
    ) -> PipelineRuntime:
        t0 = time.perf_counter()
        c = caches or CacheFactory()
        runtime = cls(config, version, build_steps(config, model_dir, get_model, c, offload), c)
        if runtime.batched is not None:
            await runtime.batched.start()
        runtime.stats.record_load(time.perf_counter() - t0, 0.0)
        return runtime

    async def close(self) -> None:
        if self.batched is not None:  # what it holds finishes first
            await self.batched.close()
        for step in self.steps:
            close = getattr(step, "close", None)
            if close is not None:
                await close()
