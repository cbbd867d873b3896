"""The steps of a pipeline (``platform: ensemble``). Each step reads named tensors from the
request's working set and writes its results back under new names:

- ``model``: a model of the repository, through its own batcher, cache and deadline checks
  (Triton's ``model_name`` / ``input_map`` / ``output_map``);
- ``tokenizer`` and ``features``: the same steps a model can put in front of itself
  (``features/tokenize.py``, ``features/fetch.py``);
- ``rules``: a score to a label (thresholds, or the largest of named columns);
- ``python``: a custom ``package.module:function`` over numpy arrays.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from milliserve.config.step_config import PipelineStep, PythonStep, Rules
from milliserve.errors import BackendError, ConfigError, MilliserveError
from milliserve.pipeline import buckets
from milliserve.protocol.datatypes import numpy_to_oip
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from milliserve.road import Call, SpanLog, Tensors, gather_parts

__all__ = ["ModelCall", "PythonCall", "RulesStep", "load_function", "tensor"]


class _Named:
    name: str
    stage: str
    needs: tuple[str, ...]
    makes: tuple[str, ...]
    # each row's outputs depend on that row alone, so requests may share a run
    # (pipeline/batching.py); a python step's function is trusted to be so, as it already
    # takes a client's batch
    rowwise = True


def tensor(name: str, data: np.ndarray[Any, Any]) -> InferTensor:
    return InferTensor(name, numpy_to_oip(data.dtype), tuple(data.shape), data)


class RulesStep(_Named):
    """Thresholds checked in order (the first one the score reaches wins), or argmax over
    labelled columns; the label is a BYTES tensor shaped like the score plus a trailing 1."""

    def __init__(self, name: str, rules: Rules) -> None:
        self.name, self.stage, self.rules = name, "postprocess", rules
        self.needs = (rules.input,)
        self.makes = (rules.output,) + ((rules.score_output,) if rules.score_output else ())
        if rules.labels:
            self._labels = np.array([s.encode() for s in rules.labels], dtype=object)
        else:
            self._bounds = np.array([t.at_least for t in rules.thresholds])
            # the bounds in each float precision, as Python floats, for the few-rows path
            self._limits = {
                np.dtype(t): self._bounds.astype(t).tolist() for t in (np.float16, np.float32, np.float64)
            }
            # index i = the first threshold reached; the last index is the default
            self._labels = np.array(
                [t.label.encode() for t in rules.thresholds] + [rules.default.encode()], dtype=object
            )

    async def run(self, tensors: Tensors, call: Call) -> None:
        r = self.rules
        x = np.asarray(tensors[r.input].data)
        if x.dtype.kind not in "fiu":
            raise BackendError(f"{self.name}: input {r.input!r} is {x.dtype}, not a numeric score")
        x = x.reshape((*x.shape, 1)) if x.ndim == 1 else x
        width = x.shape[-1]
        if r.labels:
            if width != len(r.labels):
                raise BackendError(
                    f"{self.name}: {r.input!r} has {width} columns but rules.labels names {len(r.labels)}"
                )
            index = x.argmax(-1)
            score = x.max(-1)
        else:
            if r.column >= width:
                raise BackendError(f"{self.name}: {r.input!r} has no column {r.column} (width {width})")
            score = x[..., r.column]
            index = self._first_reached(score)
        tensors[r.output] = tensor(r.output, self._labels[index][..., None])
        if r.score_output:
            tensors[r.score_output] = tensor(r.score_output, score[..., None].astype(np.float32))

    def _first_reached(self, score: np.ndarray[Any, Any]) -> Any:
        """Index of the first threshold each score reaches (the default's index if none)."""
        # compare in the score's precision: float32(0.9) reaches a threshold of 0.9
        if score.size <= 8:  # a few rows: plain Python beats a handful of numpy calls
            limits = self._limits.get(score.dtype) or self._bounds.tolist()
            found = []
            for v in score.ravel().tolist():
                j = 0
                for b in limits:
                    if v >= b:
                        break
                    j += 1
                found.append(j)
            return found if score.ndim == 1 else np.array(found).reshape(score.shape)
        bounds = self._bounds.astype(score.dtype) if score.dtype.kind == "f" else self._bounds
        reached = score[..., None] >= bounds
        # argmax finds the first True; rows with none reached get the default
        return np.where(reached.any(-1), reached.argmax(-1), len(bounds))


def load_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` imported now, so a typo fails the load, not a request."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"python step {spec!r}: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"python step {spec!r}: {module_name} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


class PythonCall(_Named):
    """``fn(inputs: dict[str, ndarray], parameters: dict[str, str]) -> dict[str, ndarray]``, sync
    (run on the event loop: keep it vectorised and short) or ``async``. It may raise
    milliserve's InvalidInputError for a bad request; any other exception is a 500."""

    def __init__(self, name: str, spec: PythonStep, stage: str) -> None:
        self.name, self.stage, self.spec = name, stage, spec
        self.needs, self.makes = spec.inputs, spec.outputs
        self.fn = load_function(spec.function)
        self._async = inspect.iscoroutinefunction(self.fn)
        self._params = dict(spec.parameters)

    async def run(self, tensors: Tensors, call: Call) -> None:
        inputs = {n: tensors[n].data for n in self.needs}
        try:
            result = self.fn(inputs, self._params)
            if self._async:
                result = await result
        except MilliserveError:
            raise
        except Exception as exc:
            raise BackendError(f"{self.name} ({self.spec.function}) failed: {exc!r}") from exc
        if not isinstance(result, Mapping):
            raise BackendError(
                f"{self.name} ({self.spec.function}) returned {type(result).__name__}, not a dict"
            )
        missing = [n for n in self.makes if n not in result]
        if missing:
            raise BackendError(f"{self.name} ({self.spec.function}) did not return {missing}")
        for n in self.makes:
            tensors[n] = tensor(n, np.asarray(result[n]))


def _cut(t: InferTensor, width: int) -> InferTensor:
    data = np.ascontiguousarray(np.asarray(t.data)[:, :width])
    return InferTensor(t.name, t.datatype, tuple(data.shape), data)


class ModelCall(_Named):
    """A model of the repository, looked up per request so that a reload is picked up.

    Its parts serve the steps that call models in other ways (pipeline/hedge.py,
    pipeline/cascade.py): ``request`` builds a model's request from the named tensors,
    ``infer`` sends it, ``write`` and ``absorb`` take the answer in."""

    def __init__(
        self,
        name: str,
        step: PipelineStep,
        model_inputs: list[str],
        model_outputs: list[str],
        get: Callable[[str, str], Any],
        model: str = "",
        also: tuple[str, ...] = (),
    ) -> None:
        """``model`` (default: the step's) is the model called; ``also`` are outputs it is
        asked for besides the mapped ones, which are not written."""
        self.name, self.stage = name, ""
        self.model = model or step.model_name
        self.version = "" if model or step.model_version < 0 else str(step.model_version)
        unknown_in = sorted(set(step.input_map) - set(model_inputs))
        unknown_out = sorted((set(step.output_map) | set(also)) - set(model_outputs))
        if unknown_in or unknown_out:
            raise ConfigError(
                f"{name}: model {self.model!r} has inputs {model_inputs} and outputs "
                f"{model_outputs}; input_map names {unknown_in or 'none'} and output_map "
                f"{unknown_out or 'none'} not among them"
            )
        # model input -> pipeline tensor (unmapped inputs read the tensor of the same name)
        self.inputs = [(m, step.input_map.get(m, m)) for m in model_inputs]
        # model output -> pipeline tensor (no output_map: every output under its own name)
        self.outputs = dict(step.output_map) if step.output_map else {m: m for m in model_outputs}
        self.needs = tuple(src for _, src in self.inputs)
        self.makes = tuple(self.outputs.values())
        asked = [*self.outputs, *(a for a in also if a not in self.outputs)]
        self._requested = [RequestedOutput(m) for m in asked]
        self._get = get
        # (the mask tensor, the model output a pooling step reads): run a padded batch as
        # length buckets (pipeline/buckets.py); set by the pipeline where that is safe
        self.buckets: tuple[str, str] | None = None
        # the bucketed output has no token axis (a classifier's or cross-encoder's scores):
        # its runs' rows are put back in order, with nothing to pad
        self.rows_out = False

    def instances(self) -> int:
        """How many instances the step's model has now (1 for a servable without any)."""
        return max(1, len(getattr(self._get(self.model, self.version), "instances", ())))

    def masks_padding(self, mask: str) -> bool:
        """Whether the model reads the tensor ``mask`` and every output it writes here has
        fixed dims after the batch (no token axis): its rows do not depend on padding."""
        if mask not in self.needs:
            return False
        config = self._get(self.model, self.version).config
        written = {t.name: t for t in config.output if t.name in self.outputs}
        return len(written) == len(self.outputs) and all(-1 not in t.dims for t in written.values())

    def takes_any_length(self) -> bool:
        """Whether every input the step sends its model is [batch, any length] (dims [-1])."""
        sent = {m for m, _ in self.inputs}
        config = self._get(self.model, self.version).config
        return all(list(t.dims) == [-1] for t in config.input if t.name in sent)

    def request(
        self, tensors: Tensors, call: Call, model: str = "", rows: np.ndarray[Any, Any] | None = None
    ) -> InferRequest:
        """The request to ``model`` (default: the step's), with ``rows`` of the batch only
        when given; the pipeline's deadline travels with it."""
        inputs = []
        for model_input, src in self.inputs:
            t = tensors[src]
            if rows is None:
                inputs.append(InferTensor(model_input, t.datatype, t.shape, t.data))
            else:
                data = np.asarray(t.data)[rows]
                inputs.append(InferTensor(model_input, t.datatype, tuple(data.shape), data))
        return InferRequest(
            model or self.model,
            self.version if not model or model == self.model else "",
            inputs,
            id=call.request.id,
            outputs=list(self._requested),
            parameters=call.request.parameters,
            deadline=call.deadline,
        )

    async def infer(self, request: InferRequest) -> InferResponse:
        """``request`` answered by its model; its errors name this step."""
        try:
            servable = self._get(request.model_name, request.model_version)
            response: InferResponse = await servable.infer(request)
        except MilliserveError as exc:
            raise type(exc)(f"{self.name}: {exc.message}") from None
        return response

    def write(self, outputs: list[InferTensor], tensors: Tensors) -> None:
        """The mapped model outputs into the named tensors (outputs asked ``also`` skipped)."""
        for t in outputs:
            dest = self.outputs.get(t.name)
            if dest is not None:
                tensors[dest] = InferTensor(dest, t.datatype, t.shape, t.data)

    @staticmethod
    def absorb(response: InferResponse, call: Call) -> None:
        """The model's stages into the request's Server-Timing, its response parameters into
        the pipeline's."""
        stages = call.stages
        for k, v in response.timings.items():
            stages[k] = stages.get(k, 0.0) + v
        if response.record_stages is not None:  # the model's own stage histograms
            response.record_stages(response.timings)
        call.notes.update(response.parameters)

    async def _traced(self, request: InferRequest, call: Call) -> InferResponse:
        log = call.request.trace
        if log is None:
            return await self.infer(request)
        request.trace = SpanLog()  # the model's spans under this step's
        try:
            return await self.infer(request)
        finally:
            log.absorb(request.trace)

    async def run(self, tensors: Tensors, call: Call) -> None:
        runs = None
        if self.buckets is not None:
            runs = buckets.plan(np.asarray(tensors[self.buckets[0]].data))
        if runs is not None:
            await self._run_buckets(tensors, call, runs)
            return
        response = await self._traced(self.request(tensors, call), call)
        self.write(response.outputs, tensors)
        self.absorb(response, call)

    async def _run_buckets(self, tensors: Tensors, call: Call, runs: list[tuple[Any, int]]) -> None:
        """The batch as runs of texts of similar length (pipeline/buckets.py), put back together."""
        assert self.buckets is not None
        mask_name, output = self.buckets
        batch, seq = tensors[mask_name].shape
        requests = []
        for rows, width in runs:
            request = self.request(tensors, call, rows=rows)
            # the tokenizer's [batch, seq] tensors, cut to the run's width
            request.inputs = [_cut(t, width) if t.shape[1:2] == (seq,) else t for t in request.inputs]
            requests.append(request)
        responses = await gather_parts([self._traced(r, call) for r in requests])
        parts = []
        per_token = not self.rows_out
        for (rows, width), response in zip(runs, responses, strict=True):
            data = next((np.asarray(t.data) for t in response.outputs if t.name == output), None)
            if per_token and (data is None or data.ndim < 3 or data.shape[:2] != (len(rows), width)):
                got = "nothing" if data is None else list(data.shape)
                raise BackendError(
                    f"{self.name}: model {self.model!r} returned {got} as {output!r} for {len(rows)} "
                    f"texts of {width} tokens; pooling needs [batch, seq, dim]"
                )
            if data is None or data.shape[:1] != (len(rows),):
                got = "nothing" if data is None else list(data.shape)
                raise BackendError(
                    f"{self.name}: model {self.model!r} returned {got} as {output!r} for {len(rows)} rows"
                )
            parts.append((rows, data))
            self.absorb(response, call)
        if per_token:
            self.write([tensor(output, buckets.scatter(parts, batch, seq))], tensors)
            return
        whole = np.empty((batch, *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
        for rows, data in parts:
            whole[rows] = data
        self.write([tensor(output, whole)], tensors)
