"""A generative model as a servable: the engine (``llm.engine``) behind the same registry
and data plane as tensor models.

Three ways in, one road: ``generate`` (OpenAI and Triton's generate extension, through
the HTTP front end), ``stream`` (gRPC's decoupled ``ModelStreamInfer``: one response per
text chunk, the last one flagged ``triton_final_response``) and ``infer`` (one response
holding the whole text). Each request is tokenized, checked against the context,
admitted against the budget (``budget { ttft_ms }``: refused when it would wait for a
sequence slot and the estimated time to first token is over the budget; a request that a
free slot takes is never refused by estimate), then handed to the engine. Leaving the event iterator early
(a client gone, a cancelled stream) cancels the sequence: the engine frees it within
one decoding step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.config.model_config import ModelConfig, TensorConfig
from milliserve.errors import (
    BackendError,
    ConfigError,
    InvalidInputError,
    OverBudgetError,
    QueueFullError,
    RequestError,
    ServerShuttingDownError,
)
from milliserve.llm.chat_prompt import ChatPrompt
from milliserve.llm.engine import Engine
from milliserve.llm.generate_extension import parse_generate
from milliserve.llm.generation_params import LOWEST_PRIORITY, GenerationParams
from milliserve.llm.outbox import outbox_of
from milliserve.llm.sequence import Event, GenRequest
from milliserve.protocol.datatypes import BYTES
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor
from milliserve.runtime.executor import Executor
from milliserve.runtime.servable import ClientInputs, model_metadata
from milliserve.runtime.stats import GenerationStats, ModelStats
from milliserve.status import status_of

__all__ = ["GenerationStream", "GenerativeServable"]

log = logging.getLogger(__name__)

TEXT_INPUT, TEXT_OUTPUT = "text_input", "text_output"
# prompts longer than this are tokenized off the event loop
OFFLOAD_CHARS = 16384


def _io_config(config: ModelConfig) -> ModelConfig:
    """The config in effect: Triton's LLM tensors (text_input -> text_output) unless declared."""
    update: dict[str, Any] = {"platform": config.platform or "llama_cpp", "backend": "llama_cpp"}
    if not config.input:
        update["input"] = (TensorConfig(name=TEXT_INPUT, data_type="TYPE_STRING", dims=(1,)),)
    if not config.output:
        update["output"] = (TensorConfig(name=TEXT_OUTPUT, data_type="TYPE_STRING", dims=(1,)),)
    return config.model_copy(update=update)


class GenerationStream:
    """The events of one request. Iterate it; ``cancel()`` (or leaving the iteration
    early) stops the sequence."""

    def __init__(self, servable: GenerativeServable, req: GenRequest, queue: asyncio.Queue[Event]) -> None:
        self._servable = servable
        self.req = req
        self._queue = queue
        self.done = False
        self.prompt_tokens = len(req.prompt)

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self._servable.engine.cancel(self.req)

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                ev = await self._queue.get()
                if ev.finish is not None:
                    self.done = True
                    if ev.finish == "error":
                        raise BackendError(ev.error or "generation failed")
                    if ev.finish == "refused":  # evicted from the queue for a newcomer
                        raise OverBudgetError(ev.error or "refused")
                yield ev
                if self.done:
                    return
        finally:
            self.cancel()


class GenerativeServable:
    """One GGUF model version served by the continuous-batching engine."""

    platform = "llama_cpp"

    def __init__(
        self, config: ModelConfig, version: str, model: Any, options: Any, executor: Executor | None = None
    ) -> None:
        self.config = _io_config(config)
        self.version = version
        self.model = model
        self.options = options
        budget = config.budget
        self.ttft_budget_s = budget.ttft_ms / 1000 if budget is not None and budget.ttft_ms else None
        itl = budget.itl_ms / 1000 if budget is not None and budget.itl_ms else None
        self.gen_stats = GenerationStats()
        self.stats = ModelStats(config.name, version, generation=self.gen_stats)
        spec = options.speculative.lower()
        self.engine = Engine(
            model,
            options.max_sequences,
            options.step_tokens,
            prefix_slots=options.prefix_cache_slots,
            min_prefix_tokens=options.min_prefix_tokens,
            host_cache_bytes=options.prompt_cache_mib << 20,
            reuse_slots=options.reuse_slots,
            draft_tokens=options.draft_tokens if spec == "ngram" else 0,
            draft_min=options.draft_min,
            speculate_below=options.speculate_below,
            draft_memory_tokens=options.draft_memory_tokens if spec == "ngram" else 0,
            stats=self.gen_stats,
            itl_budget_s=itl,
            preemption=options.preemption,
            name=config.name,
            spawn=executor.thread if executor is not None else None,
        )
        self._executor = executor
        self.stats.pending = lambda: self.engine.running + self.engine.waiting
        self.prompts = ChatPrompt(model)
        self._closed = False
        # loaded on demand (repository/on_demand.py): the arrival of the request that loaded
        # it, and the load's seconds, for that request's timing (taken by its first generate)
        self._cold: tuple[float, float] | None = None

    def loaded_on_demand(self, arrival: float, load_s: float) -> None:
        """This version was loaded for a request that arrived at ``arrival``
        (``time.perf_counter``): the next request's time to first token counts from then,
        and its timing says how long the load took."""
        self._cold = (arrival, load_s)

    # ---- loading ----
    @classmethod
    async def load(
        cls, config: ModelConfig | None, name: str, version: str, version_dir: Path, executor: Executor
    ) -> GenerativeServable:
        from milliserve.backends.registry import generative_backend_for
        from milliserve.config.model_config import config_path

        where = str(config_path(version_dir.parent))
        cfg = config or ModelConfig(name=name)
        factory = generative_backend_for(config, version_dir, where)
        if factory is None:
            raise ConfigError(f"{where}: model {name!r} is not served by a generative backend")
        path = version_dir / factory.model_filename
        if not path.is_file():
            raise ConfigError(f"{version_dir}: no {factory.model_filename} in this version directory")
        try:
            options = factory.options(cfg)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if options.speculative.lower() not in ("ngram", "off"):
            raise ConfigError(
                f"{where}: field 'parameters.speculative': {options.speculative!r}: use ngram (prompt "
                "lookup) or off"
            )
        t0 = time.perf_counter()
        n_seq = options.max_sequences + options.prefix_cache_slots
        model = await executor.run_load(factory.load_model, path, options, n_seq)
        grammars = getattr(model, "grammars", None)
        if grammars is not None:  # structured output's tokenizer, built once (~0.3 s)
            await executor.run_load(grammars.warm)
        try:
            servable = cls(cfg, version, model, options, executor)
        except BaseException:
            model.close()
            raise
        t1 = time.perf_counter()
        try:
            # the engine thread warms up itself: every decode of a context from one thread
            await asyncio.wrap_future(servable.engine.start())
        except BaseException:
            await servable.close()
            raise
        servable.stats.record_load(time.perf_counter() - t0, time.perf_counter() - t1)
        log.info(
            "loaded generative model %s version %s (%s): %d sequences x %d tokens, step %.1f ms, "
            "prefill %.2f ms/token",
            name,
            version,
            model.description,
            options.max_sequences,
            options.n_ctx,
            servable.engine.costs.step(1) * 1e3,
            servable.engine.costs.prefill_token_s * 1e3,
        )
        return servable

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self.engine.close)
        self.model.close()

    # ---- generation ----
    async def generate(self, params: GenerationParams) -> GenerationStream:
        """Admit a request and start it; the stream's events carry its text."""
        if self._closed:
            raise ServerShuttingDownError(f"model {self.config.name!r} is unloading")
        arrival = time.perf_counter()
        cold, self._cold = self._cold, None
        if cold is not None:  # the request that loaded this model: from its arrival
            arrival = cold[0]
        if params.tools is not None:  # the template's call format, or the calls' schema
            self.prompts.plan_tools(params)
        if (params.prompt and len(params.prompt) > OFFLOAD_CHARS) or sum(
            len(m.content) for m in params.messages or ()
        ) > OFFLOAD_CHARS:
            # long texts tokenize off the event loop
            if self._executor is not None:
                prompt = await self._executor.offload(self.prompts.tokens, params)
            else:
                prompt = await asyncio.to_thread(self.prompts.tokens, params)
        else:
            prompt = self.prompts.tokens(params)
        n_ctx = self.options.n_ctx
        if not prompt:
            raise RequestError("the prompt is empty after tokenization", "prompt")
        if len(prompt) >= n_ctx:
            raise RequestError(
                f"the prompt is {len(prompt)} tokens; this model's context is {n_ctx} tokens "
                "(parameters.n_ctx)",
                "messages",
            )
        room = n_ctx - len(prompt)
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        if max_tokens > room:
            raise RequestError(
                f"max_tokens {max_tokens} plus the prompt's {len(prompt)} tokens is over this model's "
                f"context of {n_ctx} tokens",
                "max_tokens",
            )
        constraint = None
        if params.schema is not None:  # compiled off the event loop (about a millisecond)
            constraint = await self._constraint(params)
        engine = self.engine
        level = self._level(params.priority)
        self._admissible(params.client)
        est = engine.estimate(len(prompt) - max(0, engine.cached(prompt)), params.client, level)
        # refused by estimate only when it would wait for a slot (a free one, or one that
        # preemption gives it, takes it at once), and never when its client holds fewer
        # slots than its share while another holds more: that client's excess is its wait
        if (
            self.ttft_budget_s is not None
            and est.queues
            and est.seconds > self.ttft_budget_s
            and not engine.fair_claim(params.client)
        ):
            self.gen_stats.refused_budget += 1
            raise OverBudgetError(
                f"model {self.config.name!r}: every sequence slot is taken and the first token "
                f"would come in about {est.seconds * 1e3:.0f} ms ({engine.running} running, "
                f"{engine.waiting} waiting), over the budget of {self.ttft_budget_s * 1e3:.0f} ms "
                "(budget.ttft_ms); retry later"
            )
        queue: asyncio.Queue[Event] = asyncio.Queue()
        put = outbox_of(asyncio.get_running_loop()).put

        def emit(ev: Event) -> None:
            put(queue, ev)

        from milliserve.backends.llama_cpp import SamplerSpec

        spec = SamplerSpec(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            repetition_penalty=params.repetition_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            constraint=constraint,
        )
        penalties = spec.repetition_penalty != 1.0 or bool(spec.frequency_penalty or spec.presence_penalty)
        req = GenRequest(
            prompt,
            max_tokens,
            spec,
            emit,
            stop=params.stop,
            ignore_eos=params.ignore_eos,
            # drafts are verified without the grammar: a constrained sequence does not draft
            speculate=params.speculate and constraint is None,
            penalties=penalties,
            arrival=arrival,
            client=params.client,
            level=level,
            # a cold start's wait is the load's, which the estimate does not learn from
            estimate=est.seconds if cold is None else 0.0,
            estimate_raw=est.raw,
            case=est.case,
            load_s=cold[1] if cold is not None else 0.0,
        )
        engine.submit(req)
        return GenerationStream(self, req, queue)

    async def _compile(self, schema: dict[str, Any], *label: str) -> Any:
        if self._executor is not None:
            return await self._executor.offload(self.model.compile_schema, schema, *label)
        return await asyncio.to_thread(self.model.compile_schema, schema, *label)

    async def _constraint(self, params: GenerationParams) -> Any:
        """The request's schema compiled; for tools, an error names the function whose
        parameters do not compile."""
        assert params.schema is not None
        if params.tools is None:
            return await self._compile(params.schema)
        try:
            return await self._compile(params.schema, "tools", "tools")
        except RequestError:
            for i, tool in enumerate(params.tools.tools):
                try:
                    await self._compile(tool.parameters, f"tools[{i}].function.parameters", "tools")
                except RequestError as exc:
                    raise RequestError(f"function '{tool.name}': {exc.message}", "tools") from None
            raise

    def _level(self, priority: int | None) -> int:
        """The queue level (0 first) of a request's ``priority`` (1 first; None: the default)."""
        levels: int = self.options.priority_levels
        default: int = self.options.default_priority_level
        if priority is None:
            return default - 1
        if priority == LOWEST_PRIORITY:
            return levels - 1
        if not 1 <= priority <= levels:
            raise RequestError(
                f"'priority' must be in 1..{levels} for model {self.config.name!r} (1 is served "
                f"first; 0 or none: level {default}), got {priority}",
                "priority",
            )
        return priority - 1

    def _admissible(self, client: str) -> None:
        """Refuse a request the queue cannot take: 429 when its client already has its
        share of it: the queue less an eighth kept for newcomers, over the clients waiting.
        A client alone may fill seven eighths; a second one that arrives while it floods
        finds room, and both then have half of that. When the queue is full, a client under
        its share takes the place of the latest request of the client with the most
        waiting, if that one is over its share (that request ends refused, 429); else 503."""
        engine = self.engine
        opts = self.options
        if engine.running < opts.max_sequences and not engine.waiting:
            return
        mine, clients = engine.waiting_of(client)
        others = clients - (1 if mine or client in engine.clients_running() else 0)
        reserve = max(1, opts.max_queue // 8)
        share = max(1, (opts.max_queue - reserve) // (others + 1))
        if mine >= share:
            self.gen_stats.refused_share += 1
            raise OverBudgetError(
                f"model {self.config.name!r}: this client already has {mine} requests waiting, its "
                f"share of the queue (max_queue {opts.max_queue} less {reserve} kept for newcomers, "
                f"over {others + 1} clients); retry when one has started"
            )
        waiting = engine.queue_length()
        if waiting < opts.max_queue:
            return
        fair = max(1, opts.max_queue // (others + 1))
        victim = engine.evictable(client, fair)
        if victim is None:
            raise QueueFullError(
                f"model {self.config.name!r}: {waiting} requests are waiting (max_queue {opts.max_queue})"
            )
        self.gen_stats.refused_share += 1
        engine.evict(
            victim,
            f"model {self.config.name!r}: the queue is full (max_queue {opts.max_queue}) and this "
            f"client has more than its share of it ({fair} of {others + 1} clients); its latest "
            "request gave its place to another client's; retry when one has started",
        )

    async def complete(self, params: GenerationParams) -> tuple[str, Event]:
        """The whole answer: its text and the last event (finish reason, usage, timing)."""
        t0 = time.perf_counter_ns()
        try:
            stream = await self.generate(params)
            parts: list[str] = []
            last = Event("", 0)
            async for ev in stream.events():
                parts.append(ev.text)
                last = ev
        except BaseException as exc:
            self.stats.record_request(time.perf_counter_ns() - t0, status_of(exc).reason)
            raise
        self.stats.record_request(time.perf_counter_ns() - t0, None)
        return "".join(parts), last

    def record(self, started_ns: int, exc: BaseException | None) -> None:
        self.stats.record_request(
            time.perf_counter_ns() - started_ns, None if exc is None else status_of(exc).reason
        )

    # ---- the tensor protocol (gRPC, /infer) ----
    @staticmethod
    def _params_of(request: InferRequest) -> GenerationParams:
        doc: dict[str, Any] = dict(request.parameters)
        for t in request.inputs:
            values = t.data.reshape(-1)
            if values.size != 1:
                raise InvalidInputError(f"input {t.name!r} must hold one element, got {values.size}")
            v = values[0]
            if isinstance(v, bytes | np.bytes_):
                v = bytes(v).decode(errors="replace")
            elif isinstance(v, np.generic):
                v = v.item()
            doc[t.name] = v
        if TEXT_INPUT not in doc:
            raise InvalidInputError(f"a generation request needs the input {TEXT_INPUT!r} (BYTES)")
        return parse_generate(doc)

    def _response(self, request: InferRequest, text: str, final: bool, ev: Event | None) -> InferResponse:
        data = np.array([text.encode()], dtype=object)
        params: dict[str, Any] = {"triton_final_response": final}
        if ev is not None and ev.finish is not None:
            params["finish_reason"] = ev.finish
            if ev.usage:
                params["completion_tokens"] = ev.usage["completion_tokens"]
                params["prompt_tokens"] = ev.usage["prompt_tokens"]
        return InferResponse(
            model_name=self.config.name,
            model_version=self.version,
            id=request.id,
            outputs=[InferTensor(TEXT_OUTPUT, BYTES, (1,), data)],
            parameters=params,
        )

    async def infer(self, request: InferRequest) -> InferResponse:
        text, last = await self.complete(self._params_of(request))
        return self._response(request, text, True, last)

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        t0 = time.perf_counter_ns()
        params = self._params_of(request)
        try:
            gen = await self.generate(params)
            async for ev in gen.events():
                if ev.finish is None:
                    if ev.text:
                        yield self._response(request, ev.text, False, None)
                else:
                    yield self._response(request, ev.text, True, ev)
        except BaseException as exc:
            self.record(t0, exc)
            raise
        self.record(t0, None)

    # ---- metadata ----
    def client_inputs(self) -> ClientInputs:
        return [(t.name, t.data_type, t.dims) for t in self.config.input]

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        return model_metadata(self.config, versions, self.platform, self.client_inputs())
