"""A pipeline (``platform: ensemble``): named tensors flow through a list of steps.

Each request validates against the pipeline's declared inputs, then runs the steps in
order. Model steps go through the models' own runtimes, so concurrent pipeline requests
batch at each model, and the pipeline's deadline travels with them (a step that cannot
make it is refused, HTTP 429, before it computes). The time of every step lands in the
request's Server-Timing stages: features, preprocess, the models' queue / infer / cache,
postprocess.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from milliserve.cache.response_cache import CacheFactory, ResponseCache, cache_key
from milliserve.config.model_config import ModelConfig, config_path
from milliserve.errors import BackendError, ConfigError, MilliserveError
from milliserve.features.store import FeatureSet
from milliserve.features.tokenize import TokenizerStep
from milliserve.pipeline.steps import (
    FetchFeatures,
    ModelCall,
    PythonCall,
    RulesStep,
    Step,
    StepContext,
    Tensors,
    Tokenize,
)
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor
from milliserve.runtime.deadline import request_deadline
from milliserve.runtime.model_runtime import failure_reason, model_metadata
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import model_io, validate_request

__all__ = ["PipelineRuntime"]

GetModel = Callable[[str, str], Any]


def build_steps(
    config: ModelConfig, model_dir: Path, get_model: GetModel, caches: CacheFactory
) -> list[Step]:
    """The steps of ``config``, checked so that every tensor a step reads exists by then and
    every pipeline output is made. ``get_model`` returns a ready runtime (dependencies are
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
                inputs = [n for n, _, _ in rt.client_inputs()]
                step = ModelCall(label, s, inputs, [t.name for t in rt.config.output], get_model)
                after_model = True
            elif s.tokenizer is not None:
                tk = s.tokenizer
                step = Tokenize(
                    label, TokenizerStep(model_dir / tk.file, tk.text_input, tk.ids, tk.mask, tk.max_length)
                )
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
            elif s.rules is not None:
                step = RulesStep(label, s.rules)
            else:
                assert s.python is not None
                step = PythonCall(label, s.python, "postprocess" if after_model else "preprocess")
        except MilliserveError as exc:
            raise ConfigError(f"{where}: {label}: {exc.message}") from None
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
    return steps


class PipelineRuntime:
    """One version of a pipeline: the same face to the data plane as a ModelRuntime."""

    def __init__(self, config: ModelConfig, version: str, steps: list[Step]) -> None:
        self.config = config
        self.version = version
        self.label = f"{config.name}:{version}"
        self.steps = steps
        self.io = model_io(config)
        self._outputs = {t.name: t.data_type for t in config.output}
        self.stats = ModelStats(config.name, version)
        self.cache: ResponseCache | None = None
        self._budget_s = config.budget.p99_ms / 1000 if config.budget is not None else None

    @classmethod
    async def load(
        cls,
        config: ModelConfig,
        version: str,
        model_dir: Path,
        get_model: GetModel,
        caches: CacheFactory | None = None,
    ) -> PipelineRuntime:
        t0 = time.perf_counter()
        c = caches or CacheFactory()
        runtime = cls(config, version, build_steps(config, model_dir, get_model, c))
        rc = config.response_cache
        if rc is not None and rc.enable:
            runtime.cache = c.make(rc.enable, rc.backend, rc.ttl_s, rc.max_bytes)
            runtime.stats.cache_enabled = runtime.cache is not None
        runtime.stats.record_load(time.perf_counter() - t0, 0.0)
        return runtime

    async def close(self) -> None:
        for step in self.steps:
            if isinstance(step, FetchFeatures):
                await step.features.close()

    # ---- serving ----
    async def infer(self, request: InferRequest) -> InferResponse:
        t0 = time.perf_counter_ns()
        stages: dict[str, float] = {}
        try:
            batch_size, _ = validate_request(request, self.io)
            deadline = request_deadline(request.deadline, request.parameters, t0 / 1e9, self._budget_s, False)
            ctx = StepContext(request.id, request.parameters, deadline, stages)
            t1 = time.perf_counter_ns()
            stages["parse"] = (t1 - t0) / 1e9
            if self.cache is None:
                outputs = await self._run(request, ctx)
            else:
                key = cache_key(self.config.name, self.version, request)
                outputs, hit = await self.cache.get_or_compute(key, lambda: self._run(request, ctx))
                elapsed = time.perf_counter_ns() - t1
                self.stats.record_cache(hit, elapsed)
                stages["cache"] = max(0.0, elapsed / 1e9 - sum(v for k, v in stages.items() if k != "parse"))
        except (MilliserveError, asyncio.CancelledError) as exc:
            self.stats.record_request(time.perf_counter_ns() - t0, failure_reason(exc))
            raise
        self.stats.inference_count += batch_size
        self.stats.execution_count += 1
        self.stats.last_inference_ms = int(time.time() * 1000)
        response = InferResponse(
            model_name=self.config.name,
            model_version=self.version,
            id=request.id,
            outputs=outputs,
            parameters=ctx.notes,
            timings=stages,
            record_stages=self.stats.record_stages,
        )
        self.stats.record_request(time.perf_counter_ns() - t0, None)
        return response

    async def _run(self, request: InferRequest, ctx: StepContext) -> list[InferTensor]:
        tensors: Tensors = {t.name: t for t in request.inputs}
        stages = ctx.stages
        for step in self.steps:
            if step.stage:
                start = time.perf_counter()
                await step.run(tensors, ctx)
                stages[step.stage] = stages.get(step.stage, 0.0) + time.perf_counter() - start
            else:  # a model step adds the model's own stages
                await step.run(tensors, ctx)
        wanted = [o.name for o in request.outputs] if request.outputs else list(self._outputs)
        out = []
        for name in wanted:
            t = tensors[name]
            if t.datatype != self._outputs[name]:
                raise BackendError(
                    f"pipeline {self.config.name!r} output {name!r} is {t.datatype} but the config "
                    f"declares {self._outputs[name]}"
                )
            out.append(t)
        return out

    # ---- descriptions ----
    def client_inputs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(t.name, t.data_type, t.dims) for t in self.config.input]

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        return model_metadata(self.config, versions, "ensemble", self.client_inputs())
