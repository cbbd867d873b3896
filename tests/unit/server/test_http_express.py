"""The express lane (docs/design.md, "The express lane"): a plain inference request whose
model's road would not wait anywhere is answered inside the parser's callback, with the
answer, the statistics and the errors the road gives; anything else takes the road."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from milliserve.config.settings import Settings
from milliserve.examples.fraud_mlp import FEATURES, build_fraud_mlp
from milliserve.protocol.json_codec import decode_infer_request
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.server.assembly import Server
from tests.support.transport import Transport

PATH = b"/v2/models/fraud_mlp/infer"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fraud_mlp as the example ships it, and the same file under other configs."""
    root = tmp_path_factory.mktemp("repo")
    build_fraud_mlp(root, rows=2000, epochs=1)
    config = (root / "fraud_mlp" / "config.pbtxt").read_text()
    model = (root / "fraud_mlp" / "1" / "model.onnx").read_bytes()
    extra = {
        "fraud_worker": 'parameters { key: "inline_execution" value: { string_value: "false" } }\n',
        "fraud_cached": "response_cache { enable: true }\n",
        "fraud_budget": "budget { p99_ms: 50 }\n",
    }
    for name, lines in extra.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(model)
        (root / name / "config.pbtxt").write_text(config.replace('"fraud_mlp"', f'"{name}"') + lines)
    return root


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def server(repo: Path, loop: asyncio.AbstractEventLoop) -> Iterator[Server]:
    ports = {"http": {"port": 0}, "grpc": {"port": 0}, "metrics": {"port": 0}}
    srv = Server(Settings(model_repository=repo, **ports))
    loop.run_until_complete(srv.start())
    yield srv
    for conn in list(srv._http[0][0].connections):  # the tests' clients hang up: no drain to wait out
        conn.transport.close()
    loop.run_until_complete(srv.stop())


def json_request(x: np.ndarray[Any, Any], path: bytes = PATH) -> bytes:
    body = orjson.dumps(
        {"inputs": [{"name": "features", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}]}
    )
    return b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (path, len(body), body)


def binary_request(x: np.ndarray[Any, Any]) -> bytes:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    )
    body = header + x.tobytes()
    head = b"POST %b HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n" % (PATH, len(header))
    return head + b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


class Client:
    """One connection to the server's HTTP listener, with or without its express lane."""

    def __init__(self, server: Server, loop: asyncio.AbstractEventLoop, express: bool = True) -> None:
        self.loop = loop
        http = server._http[0][0]
        self.transport = Transport()
        self.protocol = loop.run_until_complete(self._connect(http, express, self.transport))

    @staticmethod
    async def _connect(http: Any, express: bool, transport: Transport) -> Any:
        protocol = http.connection()  # in the loop: the protocol takes the running one
        if not express:
            protocol.express = None
        transport.protocol = protocol  # closed by the server's stop, the connection is lost
        protocol.connection_made(transport)
        return protocol

    def send(self, request: bytes) -> bool:
        """Feed ``request`` (in the running loop, as the transport would); whether its answer
        was written before the callback returned."""
        before = len(self.transport.out)

        async def fed() -> bool:
            self.protocol.data_received(request)
            at_once = len(self.transport.out) > before
            while len(self.transport.out) == before:  # the road's task answers  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            return at_once

        return self.loop.run_until_complete(asyncio.wait_for(fed(), 30))

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        head, _, body = self.transport.out[-1].partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        return int(lines[0].split()[1]), headers, body


def features(seed: int = 0, rows: int = 1) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).normal(size=(rows, FEATURES)).astype(np.float32)


def test_a_plain_request_is_answered_in_the_callback_as_the_road_answers_it(
    server: Server, loop: asyncio.AbstractEventLoop
) -> None:
    express, road = Client(server, loop), Client(server, loop, express=False)
    requests = (json_request(features(1)), json_request(features(2, rows=3)), binary_request(features(3)))
    for request in requests:
        assert express.send(request), "the express lane answers in the parser's callback"
        road.send(request)
        (s1, h1, b1), (s2, h2, b2) = express.answer(), road.answer()
        assert s1 == s2 == 200
        assert b1 == b2  # the same outputs, encoded the same way
        assert h1.keys() == h2.keys()
        assert h1["server-timing"].split(", ")[0].startswith("parse;dur=")
    # the answer came from the lane, not from the road run at once (server/eager.py)
    http = server._http[0][0]
    assert http.express is not None
    scope, body = express.protocol.cycle.scope, binary_request(features(3)).partition(b"\r\n\r\n")[2]
    answer = http.express(scope, body)
    assert answer is not None and answer[0] == 200 and answer[1] == b1


def test_its_statistics_are_those_the_road_records(server: Server, loop: asyncio.AbstractEventLoop) -> None:
    def counts(stats: dict[str, Any]) -> tuple[Any, ...]:
        s = stats["inference_stats"]
        return (
            stats["inference_count"],
            stats["execution_count"],
            *(s[k]["count"] for k in ("success", "queue", "compute_input", "compute_infer")),
            s["compute_output"]["count"],
            {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]},
        )

    runtime = server.registry.get("fraud_mlp")
    before = counts(runtime.stats.as_dict())
    express = Client(server, loop)
    for i in range(5):
        assert express.send(json_request(features(i)))
    after_express = counts(runtime.stats.as_dict())
    road = Client(server, loop, express=False)
    for i in range(5):
        road.send(json_request(features(i)))
    after_road = counts(runtime.stats.as_dict())

    def delta(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
        batches = {k: v - a[-1].get(k, 0) for k, v in b[-1].items() if v != a[-1].get(k, 0)}
        return (*(y - x for x, y in zip(a[:-1], b[:-1], strict=True)), batches)

    assert delta(before, after_express) == delta(after_express, after_road) == (5, 5, 5, 5, 5, 5, 5, {1: 5})
    histograms = runtime.stats.request_hist.counts, runtime.stats.compute_infer_hist.counts
    assert all(sum(h) == runtime.stats.success.count for h in histograms)


def test_a_bad_request_gets_the_roads_answer(server: Server, loop: asyncio.AbstractEventLoop) -> None:
    express, road = Client(server, loop), Client(server, loop, express=False)
    wrong_shape = json_request(np.zeros((1, FEATURES + 1), np.float32))
    not_json = b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{nope" % PATH
    unknown = json_request(features(), b"/v2/models/nope/infer")
    failures = server.registry.get("fraud_mlp").stats.fail.count
    for request in (wrong_shape, not_json, unknown):
        express.send(request)
        road.send(request)
        assert express.answer()[0] == road.answer()[0] in (400, 404)
        assert json.loads(express.answer()[2]) == json.loads(road.answer()[2])
    # the shape error is counted once by each lane, as the road counts it
    assert server.registry.get("fraud_mlp").stats.fail.count == failures + 2


def decoded(name: str, parameters: dict[str, Any] | None = None) -> InferRequest:
    doc: dict[str, Any] = {
        "inputs": [{"name": "features", "shape": [1, FEATURES], "datatype": "FP32", "data": [0.5] * FEATURES}]
    }
    if parameters:
        doc["parameters"] = parameters
    return decode_infer_request(orjson.dumps(doc), None, name, "")


def test_a_model_whose_road_may_wait_takes_the_road(server: Server, loop: asyncio.AbstractEventLoop) -> None:
    async def lane(name: str, parameters: dict[str, Any] | None = None) -> InferResponse | None:
        return server.registry.get(name).infer_now(decoded(name, parameters))

    assert loop.run_until_complete(lane("fraud_mlp")) is not None
    # a model on its worker thread, one behind a cache, a request with parameters (a
    # priority, a timeout, a sequence): the road's
    assert loop.run_until_complete(lane("fraud_worker")) is None
    assert loop.run_until_complete(lane("fraud_cached")) is None
    assert loop.run_until_complete(lane("fraud_mlp", {"timeout": 10_000_000})) is None
    # a budget is checked in the lane: an idle microsecond model is admitted at once
    assert loop.run_until_complete(lane("fraud_budget")) is not None
    client = Client(server, loop)
    for name in ("fraud_worker", "fraud_cached", "fraud_budget"):
        client.send(json_request(features(), f"/v2/models/{name}/infer".encode()))
        assert client.answer()[0] == 200


def reference(rows: np.ndarray[Any, Any], repo: Path) -> np.ndarray[Any, Any]:
    """fraud_mlp's probabilities for ``rows``, from ONNX Runtime run directly, one row at a time."""
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(repo / "fraud_mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return np.concatenate([session.run(None, {"features": rows[i : i + 1]})[0] for i in range(len(rows))])


def probabilities(answer: bytes) -> np.ndarray[Any, Any]:
    out = json.loads(answer.partition(b"\r\n\r\n")[2])["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def test_requests_of_one_loop_turn_share_one_run_and_each_gets_its_own_answer(
    server: Server, loop: asyncio.AbstractEventLoop, repo: Path
) -> None:
    """Concurrent clients (bursts read in one turn of the loop) are answered from shared
    batches, each with its own rows: once a burst's request joins a turn (the batcher's
    look for companions, every 16th request), the rest of the burst joins it too."""
    runtime = server.registry.get("fraud_mlp")
    batches_before = {
        b["batch_size"]: b["compute_infer"]["count"] for b in runtime.stats.as_dict()["batch_stats"]
    }
    count_before = runtime.stats.as_dict()["inference_count"]
    clients = [Client(server, loop) for _ in range(8)]
    rows = features(7, rows=8 * 40)

    async def bursts() -> None:
        for b in range(40):
            before = [len(c.transport.out) for c in clients]
            for i, c in enumerate(clients):  # one burst: all read in this callback
                c.protocol.data_received(json_request(rows[b * 8 + i : b * 8 + i + 1]))
            while any(len(c.transport.out) == n for c, n in zip(clients, before, strict=True)):  # noqa: ASYNC110
                await asyncio.sleep(0)

    loop.run_until_complete(asyncio.wait_for(bursts(), 60))
    want = reference(rows, repo)
    for i, c in enumerate(clients):
        assert len(c.transport.out) == 40
        for b, answer in enumerate(c.transport.out):
            assert answer.startswith(b"HTTP/1.1 200 ")
            np.testing.assert_allclose(probabilities(answer)[0], want[b * 8 + i], rtol=1e-5, atol=1e-6)
    stats = runtime.stats.as_dict()
    assert stats["inference_count"] == count_before + 320
    batches = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    shared = {
        k: v - batches_before.get(k, 0) for k, v in batches.items() if k > 1 and v > batches_before.get(k, 0)
    }
    assert shared, f"no burst shared a run: {batches}"


def test_a_turns_batch_answers_a_gone_client_by_no_one_and_the_rest_as_ever(
    server: Server, loop: asyncio.AbstractEventLoop, repo: Path
) -> None:
    """A request in a turn's batch whose client leaves before the batch runs costs nobody
    else: the others are answered, and a pipelined request behind one in the batch after it."""
    runtime = server.registry.get("fraud_mlp")
    gone, stays, pipelined = Client(server, loop), Client(server, loop), Client(server, loop)
    x = features(11, rows=3)

    async def turn() -> None:
        assert runtime.infer_soon(decoded("fraud_mlp")) is not None  # a turn is forming
        gone.protocol.data_received(json_request(x[:1]))
        stays.protocol.data_received(json_request(x[1:2]))
        pipelined.protocol.data_received(json_request(x[2:3]) + json_request(x[:1]))
        assert not gone.transport.out and not stays.transport.out and not pipelined.transport.out
        gone.transport.closing = True
        gone.protocol.connection_lost(None)
        while len(stays.transport.out) < 1 or len(pipelined.transport.out) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0)

    loop.run_until_complete(asyncio.wait_for(turn(), 30))
    want = reference(x, repo)
    assert not gone.transport.out
    np.testing.assert_allclose(probabilities(stays.transport.out[0])[0], want[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probabilities(pipelined.transport.out[0])[0], want[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probabilities(pipelined.transport.out[1])[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_bad_request_in_a_turn_gets_the_roads_answer_alone(
    server: Server, loop: asyncio.AbstractEventLoop
) -> None:
    good, bad = Client(server, loop), Client(server, loop)
    runtime = server.registry.get("fraud_mlp")

    async def turn() -> None:
        assert runtime.infer_soon(decoded("fraud_mlp")) is not None
        bad.protocol.data_received(json_request(np.zeros((1, FEATURES + 1), np.float32)))
        good.protocol.data_received(json_request(features(3)))
        while not good.transport.out or not bad.transport.out:  # noqa: ASYNC110
            await asyncio.sleep(0)

    loop.run_until_complete(asyncio.wait_for(turn(), 30))
    assert bad.answer()[0] == 400 and "features" in json.loads(bad.answer()[2])["error"]
    assert good.answer()[0] == 200


def test_a_turn_that_finds_its_instance_taken_queues_with_its_deadline_and_client(
    server: Server, loop: asyncio.AbstractEventLoop, repo: Path
) -> None:
    """Where the road took the instance between a turn's first request and its run, the
    turn's requests queue in the batcher as the road's would: with their deadlines and
    clients, their arrivals counted once, and answered when the instance is back."""
    runtime = server.registry.get("fraud_mlp")
    execute = runtime.execute
    batcher = execute.batcher
    x = features(21)

    async def turn() -> tuple[list[Any], list[Any]]:
        tensor = {"name": "features", "shape": [1, FEATURES], "datatype": "FP32", "data": x.tolist()}
        request = decode_infer_request(orjson.dumps({"inputs": [tensor]}), None, "fraud_mlp", "")
        request.client = ("10.0.0.7", 4242)
        request.deadline = time.perf_counter() + 30
        soon = runtime.infer_soon(request)
        assert soon is not None
        assert batcher.pending() >= 1  # waiting in the turn, it counts as pending
        seen: list[Any] = []
        soon.then(seen.append)
        gap = batcher._gap
        index = batcher._free.pop()  # the road takes the instance before the turn runs
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        queued = [it for q in batcher._queues for it in q]
        assert batcher._gap == gap  # not counted again as it queued
        batcher.give_back(index, time.perf_counter())
        batcher._wakeup.set()
        while not seen:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        return queued, seen

    queued, seen = loop.run_until_complete(asyncio.wait_for(turn(), 30))
    assert len(queued) == 1
    assert queued[0].deadline is not None and queued[0].flow == ("10.0.0.7", 4242)
    assert isinstance(seen[0], InferResponse)
    np.testing.assert_allclose(seen[0].outputs[0].data[0], reference(x, repo)[0], rtol=1e-5, atol=1e-6)


def test_a_turn_estimate_pushed_up_comes_back_down(server: Server) -> None:
    """A busy spell that pushed the turns' estimate over the inline bound does not keep
    requests off the turns for good: the inline estimate, which every run feeds, lets them in."""
    execute = server.registry.get("fraud_mlp").execute
    saved = execute.turn.per_work
    try:
        execute.turn.per_work = 1.0  # a second per element: no turn would ever run again
        assert execute.turn.possible(FEATURES)
    finally:
        execute.turn.per_work = saved


def test_a_turn_forming_when_its_model_unloads_is_answered(
    server: Server, loop: asyncio.AbstractEventLoop, repo: Path
) -> None:
    """Requests in a turn's batch were accepted: an unload that comes before the batch runs
    answers them, as it drains the queued ones, before the model's instances close."""
    runtime = server.registry.get("fraud_budget")
    x = features(5)

    async def turn() -> Any:
        assert runtime.infer_soon(decoded("fraud_budget")) is not None
        tensor = {"name": "features", "shape": [1, FEATURES], "datatype": "FP32", "data": x.tolist()}
        request = decode_infer_request(orjson.dumps({"inputs": [tensor]}), None, "fraud_budget", "")
        soon = runtime.infer_soon(request)
        assert soon is not None
        seen: list[Any] = []
        soon.then(seen.append)
        await server.registry.unload("fraud_budget")
        return seen

    seen = loop.run_until_complete(asyncio.wait_for(turn(), 30))
    assert len(seen) == 1 and isinstance(seen[0], InferResponse), seen
    np.testing.assert_allclose(seen[0].outputs[0].data[0], reference(x, repo)[0], rtol=1e-5, atol=1e-6)
