"""The terminal of a stateful model's road: the sequence batcher (``sequence_batching``).

It reads a request's sequence parameters (``sequence_id``, a uint64 or a string;
``sequence_start``; ``sequence_end``), queues it on its sequence (runtime/sequence_scheduler.py),
and runs each batch: the requests' inputs row by row, the control inputs the config
declares (START, END, READY, CORRID), and for implicit state the state each sequence's
previous request produced (or its initial state when the request starts the sequence).
After the run, each sequence keeps its rows of the state outputs for its next request.

Requests of a stateful model carry one row each (batch size 1), as in Triton. A model
without batching (``max_batch_size: 0``) runs one sequence per instance at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.backends.base import Backend
from milliserve.config.model_config import ModelConfig
from milliserve.config.sequence_batching import ResolvedControl, SequenceBatching, SequenceState
from milliserve.errors import BackendError, ConfigError, InvalidInputError
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.json_codec import flag
from milliserve.protocol.types import InferTensor
from milliserve.road import Call, Outputs
from milliserve.runtime.executor import InstanceWorker
from milliserve.runtime.sequence_scheduler import Row, SeqRequest, Sequence, SequenceScheduler
from milliserve.runtime.stats import ModelStats
from milliserve.runtime.validation import ModelIO

__all__ = ["SequenceExecute", "sequence_id"]

log = logging.getLogger(__name__)
Arrays = dict[str, np.ndarray[Any, Any]]
_MAX_U64 = (1 << 64) - 1


def sequence_id(params: dict[str, Any], label: str) -> int | str:
    """The request's correlation id; InvalidInputError when it is missing, zero or empty,
    or neither a uint64 nor a string."""
    value = params.get("sequence_id") if params else None
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_U64:
        return value
    if value is None or value in (0, ""):
        raise InvalidInputError(
            f"inference request to model {label!r} must specify a non-zero or non-empty correlation "
            "ID (parameter sequence_id): the model is stateful (sequence_batching)"
        )
    raise InvalidInputError(f"parameter 'sequence_id' must be a uint64 or a string, got {value!r}")


def _initial_state(state: SequenceState, model_dir: Path, batching: bool) -> np.ndarray[Any, Any]:
    """What a sequence's state input holds on its first request."""
    dims = state.start_dims()
    dtype = np.dtype(object) if state.data_type == BYTES else oip_to_numpy(state.data_type)
    init = state.initial_state[0] if state.initial_state else None
    if init is not None and init.data_file:
        path = model_dir / "initial_state" / init.data_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"state {state.input_name!r}: cannot read initial state {path}: {exc}"
            ) from None
        count = int(np.prod(dims)) if dims else 1
        if state.data_type == BYTES or len(raw) != count * dtype.itemsize:
            raise ConfigError(
                f"state {state.input_name!r}: {path} has {len(raw)} bytes, expected {count} "
                f"{state.data_type} values ({count * dtype.itemsize} bytes) for dims {list(dims)}"
            )
        arr = np.frombuffer(raw, dtype=dtype).reshape(dims).copy()
    elif state.data_type == BYTES:
        arr = np.full(dims, b"", dtype=object)
    else:
        arr = np.zeros(dims, dtype=dtype)
    return arr[None] if batching else arr


class SequenceExecute:
    """Queue requests on their sequences; run their batches on the model's instances."""

    def __init__(
        self,
        label: str,
        config: ModelConfig,
        model_dir: Path,
        backends: Seq[Backend],
        io: ModelIO,
        stats: ModelStats,
        inline: str = "auto",
        inline_below_s: float = 100e-6,
    ) -> None:
        sb = config.sequence_batching
        assert sb is not None
        self.label = label
        self.config: SequenceBatching = sb
        self.io = io
        self.stats = stats
        self.batching = config.max_batch_size > 0
        self._backends = list(backends)
        self.controls: list[ResolvedControl] = sb.controls()
        self.states = sb.state
        self._initial = {s.input_name: _initial_state(s, model_dir, self.batching) for s in sb.state}
        # what the backend must produce: the client's outputs and every state output
        self._outputs = list(dict.fromkeys([*io.outputs, *(s.output_name for s in sb.state)]))
        self._client_outputs = list(io.outputs)
        self._corrid = next((c for c in self.controls if c.kind == "CONTROL_SEQUENCE_CORRID"), None)
        if sb.oldest is not None:
            delay_s = sb.oldest.max_queue_delay_microseconds / 1e6
            target = SequenceScheduler.target_of(
                delay_s, sb.oldest.preferred_batch_size, config.max_batch_size, 0
            )
            candidates = sb.oldest.max_candidate_sequences
        else:
            direct = sb.direct
            delay_s = direct.max_queue_delay_microseconds / 1e6 if direct else 0.0
            util = direct.minimum_slot_utilization if direct else 0.0
            target = SequenceScheduler.target_of(delay_s, (), config.max_batch_size, util)
            candidates = 0
        self.scheduler = SequenceScheduler(
            label,
            sb.strategy,
            len(self._backends),
            config.max_batch_size,
            sb.idle_s,
            self._run,
            candidates,
            delay_s,
            target,
            self._key,
        )
        self.workers: list[InstanceWorker] = []
        self._inline_mode = inline
        self._inline_below_s = inline_below_s
        self.inline = inline == "true"
        self.probe_feeds: Arrays | None = None
        stats.pending = self.scheduler.pending
        stats.queued = lambda: self.scheduler.waiting

    async def start(
        self, workers: list[InstanceWorker], compute_s: float | None, work: int, threads: int
    ) -> None:
        self.workers = workers
        if self._inline_mode == "auto" and compute_s is not None and threads == 1:
            self.inline = compute_s < self._inline_below_s
        await self.scheduler.start()

    async def close(self) -> None:
        await self.scheduler.close()
        for w in self.workers:
            w.close()
        for b in self._backends:
            b.close()

    # ---- the request ----
    async def __call__(self, call: Call) -> Outputs:
        request = call.request
        params = request.parameters
        corr = sequence_id(params, self.label)
        if self.batching and call.batch_size != 1:
            raise InvalidInputError(
                f"inference request to model {self.label!r} must specify batch-size 1 due to "
                f"requirements of sequence batcher (got {call.batch_size})"
            )
        c = self._corrid
        if c is not None and isinstance(corr, str) and c.datatype != BYTES:
            raise InvalidInputError(
                f"sequence_id {corr!r} is a string but model {self.label!r} takes a "
                f"{c.datatype} correlation id (CONTROL_SEQUENCE_CORRID)"
            )
        if c is not None and isinstance(corr, int) and c.datatype != BYTES:
            top = {"INT32": (1 << 31) - 1, "UINT32": (1 << 32) - 1, "INT64": (1 << 63) - 1}.get(c.datatype)
            if top is not None and corr > top:
                raise InvalidInputError(
                    f"sequence_id {corr} does not fit model {self.label!r}'s {c.datatype} correlation id"
                )
        future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
        item = SeqRequest(
            {t.name: t.data for t in request.inputs},
            call.signature,
            flag(params, "sequence_start"),
            flag(params, "sequence_end"),
            future,
        )
        self.scheduler.submit(corr, item)
        outputs = await future
        call.stages["queue"] = item.dispatched - item.enqueued
        call.stages["infer"] = time.perf_counter() - item.dispatched
        specs = self.io.outputs
        wanted = [o.name for o in request.outputs] if request.outputs else self._client_outputs
        return [InferTensor(n, specs[n].datatype, outputs[n].shape, outputs[n]) for n in wanted]

    # ---- batches ----
    def _state(self, seq: Sequence, start: bool, name: str) -> np.ndarray[Any, Any]:
        """The state input a request of ``seq`` gets: the sequence's, or the initial one."""
        if not start:
            held = seq.state.get(name)
            if held is not None:
                return held
        return self._initial[name]

    def _key(self, seq: Sequence, req: SeqRequest) -> Any:
        """Rows batch together when their inputs and their states have equal shapes."""
        if not self.states:
            return req.signature
        return req.signature, tuple(self._state(seq, req.start, s.input_name).shape for s in self.states)

    def _implicit(
        self,
        seqs: list[Sequence],
        width: int,
        rows: list[int],
        starts: list[bool],
        ends: list[bool],
        ready: list[bool],
    ) -> Arrays:
        """Control and state inputs for ``width`` rows; ``rows[i]`` is the row of ``seqs[i]``."""
        feeds: Arrays = {}
        shape = (width, 1) if self.batching else (1,)
        for c in self.controls:
            if c.kind == "CONTROL_SEQUENCE_CORRID":
                dtype: Any = object if c.datatype == BYTES else oip_to_numpy(c.datatype)
                arr = np.full(shape, b"" if c.datatype == BYTES else 0, dtype=dtype)
                for seq, r in zip(seqs, rows, strict=True):
                    arr.reshape(-1)[r] = str(seq.corr).encode() if c.datatype == BYTES else seq.corr
            else:
                dtype = oip_to_numpy(c.datatype)
                arr = np.full(shape, c.false, dtype=dtype)
                flags = {"CONTROL_SEQUENCE_START": starts, "CONTROL_SEQUENCE_END": ends}.get(c.kind, ready)
                for on, r in zip(flags, rows, strict=True):
                    if on:
                        arr.reshape(-1)[r] = c.true
            feeds[c.name] = arr
        for s in self.states:
            held = [self._state(seq, start, s.input_name) for seq, start in zip(seqs, starts, strict=True)]
            if not self.batching or width == 1:
                feeds[s.input_name] = held[0]
                continue
            parts = [np.zeros_like(held[0])] * width  # rows without a request (direct)
            for arr, r in zip(held, rows, strict=True):
                parts[r] = arr
            feeds[s.input_name] = np.concatenate(parts)
        return feeds

    def _feeds(self, rows: list[Row], width: int) -> Arrays:
        first = rows[0].request.inputs
        if self.batching and (width > 1 or rows[0].row != 0):
            feeds: Arrays = {}
            for name, arr in first.items():
                parts = [np.zeros_like(arr)] * width  # rows without a request (direct): zeros
                for r in rows:
                    parts[r.row] = r.request.inputs[name]
                feeds[name] = np.concatenate(parts)
        else:
            feeds = dict(first)
        feeds.update(
            self._implicit(
                [r.seq for r in rows],
                width,
                [r.row for r in rows],
                [r.request.start for r in rows],
                [r.request.end for r in rows],
                [True] * len(rows),
            )
        )
        return feeds

    def _execute(self, backend: Backend, feeds: Arrays) -> tuple[Arrays, int]:
        t0 = time.perf_counter_ns()
        out = backend.run(feeds, self._outputs)
        return out, time.perf_counter_ns() - t0

    async def _run(self, instance: int, rows: list[Row], width: int) -> None:
        t0 = time.perf_counter_ns()
        feeds = self._feeds(rows, width)
        t1 = time.perf_counter_ns()
        backend = self._backends[instance]
        try:
            if self.inline:
                outputs, infer_ns = self._execute(backend, feeds)
            else:
                outputs, infer_ns = await self.workers[instance].run(self._execute, backend, feeds)
        except (BackendError, InvalidInputError) as exc:
            if isinstance(exc, BackendError):
                log.warning("%s: %s", self.label, exc)
            for r in rows:
                if not r.request.future.done():
                    r.request.future.set_exception(exc)
            return
        t2 = time.perf_counter_ns()
        for r in rows:
            at = slice(r.row, r.row + 1) if self.batching else slice(None)
            for s in self.states:
                # a copy: the row must not keep the whole batch's output alive
                r.seq.state[s.input_name] = outputs[s.output_name][at].copy()
            if not r.request.future.done():
                r.request.future.set_result({n: outputs[n][at] for n in self._client_outputs})
        t3 = time.perf_counter_ns()
        queue_ns = [int((r.request.dispatched - r.request.enqueued) * 1e9) for r in rows]
        self.stats.record_batch(len(rows), queue_ns, t1 - t0, infer_ns, t3 - t2)
