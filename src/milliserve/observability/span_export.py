"""Finished spans leave the server's process: a child process encodes and exports them.

Why a process and not the OpenTelemetry SDK's batch processor (a thread): that thread
encodes spans into protobuf messages and posts them in Python, holding the GIL in 5 ms
slices that the event loop then waits for. With the default sampler (1% of requests) it
made every request's p99 2.5-3.5x tracing off (benchmarks/server_overhead.py): the 99% that
are not traced paid for the 1% that are. Here the loop appends one tuple per span to a list;
a thread of this process wakes every ``interval_s`` (or at ``BATCH`` spans), serializes the
list with ``marshal`` (C, microseconds) and writes it to the child's stdin, which releases
the GIL. The child (``python -m milliserve.observability.span_export``, niced, ignoring
SIGINT and SIGTERM: it ends when the pipe does) rebuilds the SDK's finished spans and exports
them with its OTLP/HTTP exporter, on its own interpreter.

The pipe carries frames: a 4-byte little-endian length, then ``marshal.dumps`` of a list of
records (``Record``): the server's own data, from its own process, never a file or a peer's.
What cannot keep up is dropped, as the SDK's queue drops: over ``MAX_PENDING`` spans waiting.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

__all__ = ["BATCH", "MAX_PENDING", "Record", "SpanPipe", "quiet_drops"]

log = logging.getLogger(__name__)

# one span: name, trace id, span id, parent span id (0: none), the parent is the caller's
# (remote), SpanKind value, start and end (epoch ns), attributes (None or a dict of OTLP
# values), StatusCode value, status description, the trace state's W3C header ("": none)
Record = tuple[str, int, int, int, bool, int, int, int, Any, int, Any, str]

BATCH = 512  # spans: a frame at least this often, and the exporter's request at most this big
MAX_PENDING = 65536  # spans waiting in this process; more are dropped (counted, logged)
_FRAME = struct.Struct("<I")


class _OncePerMinute(logging.Filter):
    """Lets a repeated warning through once a minute (the SDK warns once per span it drops,
    or per failed export: a collector that is down would cost a log record each time)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = str(record.msg)
        if now - self._last.get(key, -60.0) < 60.0:
            return False
        self._last[key] = now
        return True


def quiet_drops() -> None:
    """The SDK's repeated warnings, once a minute each."""
    names = (
        "opentelemetry.sdk._shared_internal",
        "opentelemetry.sdk.trace.export",
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    )
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OncePerMinute) for f in logger.filters):
            logger.addFilter(_OncePerMinute())


class SpanPipe:
    """The server's side: ``add`` a span record from any thread (the loop's, mostly); a
    sender thread writes them to the exporting child every ``interval_s``; ``close``
    sends what is left and waits for the child to export it (at most ``timeout_s``)."""

    def __init__(
        self, endpoint: str, service_name: str, version: str, timeout_s: float, interval_s: float
    ) -> None:
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.dropped = 0
        self._pending: deque[Record] = deque()  # the loop appends right, the sender takes left
        self._wake = threading.Event()
        self._closing = False
        self._last_drop_log = -60.0
        self.child = subprocess.Popen(
            [sys.executable, "-m", __name__, endpoint, service_name, version, str(timeout_s)],
            stdin=subprocess.PIPE,
            close_fds=True,
        )
        self._thread = threading.Thread(target=self._send_loop, name="milliserve-span-pipe", daemon=True)
        self._thread.start()

    def add(self, records: list[Record]) -> None:
        """Queue one request's spans (deque.extend: atomic under the GIL, no lock)."""
        pending = self._pending
        if len(pending) >= MAX_PENDING:
            self.dropped += len(records)
            now = time.monotonic()
            if now - self._last_drop_log >= 60.0:
                self._last_drop_log = now
                log.warning("tracing: %d span(s) dropped so far: the exporter does not keep up", self.dropped)
            return
        pending.extend(records)
        if len(pending) >= BATCH:
            self._wake.set()

    def _take(self) -> list[Record]:
        pending = self._pending
        return [pending.popleft() for _ in range(len(pending))]

    def _send_loop(self) -> None:
        stdin = self.child.stdin
        assert stdin is not None
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            closing = self._closing
            taken = self._take()
            if taken:
                try:
                    frame = _encode(taken)
                    stdin.write(_FRAME.pack(len(frame)) + frame)
                    stdin.flush()
                except (BrokenPipeError, OSError, ValueError) as exc:
                    self.dropped += len(taken)
                    log.warning(
                        "tracing: the span exporter is gone (%r): %d span(s) dropped", exc, len(taken)
                    )
                    return
            if closing:
                return

    def close(self) -> None:
        """Send what is pending; let the child export it and end (at most ``timeout_s``)."""
        self._closing = True
        self._wake.set()
        self._thread.join(self.timeout_s)
        if self.child.stdin is not None:
            with contextlib.suppress(OSError):
                self.child.stdin.close()
        try:
            self.child.wait(self.timeout_s + 5.0)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


_PLAIN = (str, bool, int, float, bytes)


def _encode(records: list[Record]) -> bytes:
    """The frame's body. An attribute of a type OpenTelemetry does not take goes as its
    text (a numpy scalar would otherwise go as its bytes: marshal takes buffers)."""
    return marshal.dumps([r if r[8] is None or _plain_attrs(r[8]) else _cleaned(r) for r in records])


def _plain_attrs(attrs: dict[str, Any]) -> bool:
    for v in attrs.values():
        if type(v) in _PLAIN:
            continue
        if type(v) in (list, tuple) and all(type(x) in _PLAIN for x in v):
            continue
        return False
    return True


def _value(v: Any) -> Any:
    if type(v) in _PLAIN:
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [x if type(x) in _PLAIN else str(x) for x in v]
    return str(v)


def _cleaned(record: Record) -> Record:
    attrs = {str(k): _value(v) for k, v in record[8].items()}
    return (*record[:8], attrs, *record[9:])


# ---- the child ----
def _read_exactly(stream: Any, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _child(endpoint: str, service_name: str, version: str, timeout_s: float) -> None:
    # the server's stop ends this process (its pipe closes): a Ctrl-C in the terminal, which
    # reaches the whole process group, must not end it before the last spans are sent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(5)  # the server's requests come first when the cores are busy
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

    quiet_drops()
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)
    resource = Resource.create({"service.name": service_name, "service.version": version})
    scope = InstrumentationScope("milliserve", version)
    flags = TraceFlags(TraceFlags.SAMPLED)
    states: dict[str, Any] = {}

    def span(r: Record) -> Any:
        name, trace_id, span_id, parent_id, remote, kind, start, end, attrs, code, desc, state = r
        if state not in states:
            states[state] = TraceState.from_header([state]) if state else None
        ts = states[state]
        context = SpanContext(trace_id, span_id, False, flags, ts)
        parent = SpanContext(trace_id, parent_id, remote, flags, ts) if parent_id else None
        return ReadableSpan(
            name,
            context,
            parent,
            resource,
            attrs,
            kind=SpanKind(kind),
            status=Status(StatusCode(code), desc),
            start_time=start,
            end_time=end,
            instrumentation_scope=scope,
        )

    stdin = sys.stdin.buffer
    while (head := _read_exactly(stdin, _FRAME.size)) is not None:
        body = _read_exactly(stdin, _FRAME.unpack(head)[0])
        if body is None:
            break
        records = marshal.loads(body)
        for i in range(0, len(records), BATCH):
            exporter.export([span(r) for r in records[i : i + BATCH]])
    exporter.shutdown()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
