"""The span pipe (observability/span_export.py): spans handed to it in the server's process
are exported by its child process over OTLP/HTTP to a real receiver on loopback; what is
pending at the close is sent before the child ends; an attribute marshal cannot carry goes
as its text; a child that is gone costs a count, never the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from milliserve.observability.span_export import SpanPipe
from milliserve.testing import wait_until


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.services: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                msg = ExportTraceServiceRequest.FromString(
                    self.rfile.read(int(self.headers["Content-Length"]))
                )
                for rs in msg.resource_spans:
                    receiver.services.update(
                        a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
                    )
                    for ss in rs.scope_spans:
                        receiver.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1/traces"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.http.shutdown()
    r.http.server_close()


def record(name: str, span_id: int, parent: int = 0, attrs: Any = None, state: str = "") -> Any:
    return (
        name,
        0xABC,
        span_id,
        parent,
        parent == 7,
        1 if parent == 7 else 0,
        1_000,
        2_000,
        attrs,
        0,
        None,
        state,
    )


def test_spans_reach_the_collector_with_their_parentage_and_the_close_sends_what_is_pending(
    receiver: Receiver,
) -> None:
    pipe = SpanPipe(receiver.url, "svc-pipe", "9.9", timeout_s=10.0, interval_s=3600.0)
    try:
        # an hour between sends: only the close sends these
        pipe.add([record("root", 1, parent=7, attrs={"a": 1, "b": "x", "c": [1.5, 2.5]}, state="k=v")])
        pipe.add([record("child", 2, parent=1, attrs={"odd": np.float32(0.5)})])
    finally:
        pipe.close()
    assert pipe.child.returncode == 0 and pipe.dropped == 0
    by_name = {s.name: s for s in receiver.spans}
    assert set(by_name) == {"root", "child"} and receiver.services == {"svc-pipe"}
    root, child = by_name["root"], by_name["child"]
    assert root.trace_id == (0xABC).to_bytes(16, "big") and root.parent_span_id == (7).to_bytes(8, "big")
    assert root.kind == 2 and child.kind == 1  # OTLP's SPAN_KIND_SERVER, SPAN_KIND_INTERNAL
    assert root.trace_state == "k=v"
    assert child.parent_span_id == root.span_id
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["a"].int_value == 1 and attrs["b"].string_value == "x"
    assert [v.double_value for v in attrs["c"].array_value.values] == [1.5, 2.5]
    # numpy's float is not marshal's: it goes as its text rather than failing the batch
    assert {a.key: a.value.string_value for a in child.attributes} == {"odd": "0.5"}
    assert root.start_time_unix_nano == 1_000 and root.end_time_unix_nano == 2_000


def test_spans_leave_on_the_interval_while_the_server_runs(receiver: Receiver) -> None:
    pipe = SpanPipe(receiver.url, "svc", "1", timeout_s=10.0, interval_s=0.05)
    try:
        pipe.add([record("early", 3)])
        wait_until(lambda: any(s.name == "early" for s in receiver.spans), 30, "the span, before the close")
    finally:
        pipe.close()


def test_a_child_that_is_gone_costs_a_count_not_the_caller(receiver: Receiver) -> None:
    pipe = SpanPipe(receiver.url, "svc", "1", timeout_s=10.0, interval_s=0.05)
    pipe.child.kill()
    pipe.child.wait()
    for i in range(20):
        pipe.add([record("lost", 10 + i)])  # never raises
    wait_until(lambda: pipe.dropped > 0, 30, "the sender to notice the child is gone")
    pipe.close()
    assert not any(s.name == "lost" for s in receiver.spans)
