"""Stateful models with Triton's clients against a real server: the state a sequence carries
(implicit state, running_stats) over HTTP, gRPC and ModelStreamInfer, reset at START;
sequences batched together; uint64 and string correlation ids; an idle sequence freed;
requests for sequences that are not live refused with a clear 400."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from milliserve.examples.stateful import build_running_stats
from milliserve.examples.triton import build_triton_examples
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequences")
    build_running_stats(repo)  # direct, 4 slots
    build_running_stats(repo, "running_oldest", strategy="oldest", instances=2)
    # waits up to 200 ms for the other live sequences to send: batches form reliably
    build_running_stats(repo, "running_batched", strategy="oldest", queue_delay_us=200_000)
    # one slot, 300 ms idle timeout: a second sequence waits for the first to end or idle out
    build_running_stats(repo, "running_single", max_batch_size=0, idle_us=300_000)
    build_triton_examples(repo, ["simple_sequence", "simple_string_dyna_sequence"])
    with ServerProcess(repo) as proc:
        yield proc


class Session:
    """One client's calls to a running_stats model, over HTTP or gRPC."""

    def __init__(self, server: ServerProcess, protocol: str, model: str = "running_stats") -> None:
        self.m = httpclient if protocol == "http" else grpcclient
        url = server.http_url if protocol == "http" else server.grpc_url
        self.c = self.m.InferenceServerClient(url)
        self.model = model
        self.shape = [4] if model == "running_single" else [1, 4]

    def send(
        self, seq: Any, x: float, start: bool = False, end: bool = False
    ) -> tuple[list[float], int, int]:
        inp = self.m.InferInput("X", self.shape, "FP32")
        inp.set_data_from_numpy(np.full(self.shape, x, np.float32))
        r = self.c.infer(self.model, [inp], sequence_id=seq, sequence_start=start, sequence_end=end)
        total = r.as_numpy("TOTAL").reshape(-1).tolist()
        return total, int(r.as_numpy("COUNT").reshape(-1)[0]), int(r.as_numpy("CORR").reshape(-1)[0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["running_stats", "running_oldest"])
def test_state_is_carried_per_sequence_and_reset_at_start(
    server: ServerProcess, protocol: str, model: str
) -> None:
    s = Session(server, protocol, model)
    a, b = (101, 102) if protocol == "http" else (201, 202)
    assert s.send(a, 1.0, start=True) == ([1.0] * 4, 1, a)
    assert s.send(b, 10.0, start=True) == ([10.0] * 4, 1, b)
    assert s.send(a, 2.0) == ([3.0] * 4, 2, a)  # a's sum, not b's
    assert s.send(b, 20.0) == ([30.0] * 4, 2, b)
    assert s.send(a, 4.0) == ([7.0] * 4, 3, a)
    assert s.send(a, 5.0, start=True) == ([5.0] * 4, 1, a)  # START resets the state
    assert s.send(a, 1.0, end=True) == ([6.0] * 4, 2, a)
    assert s.send(b, 1.0, end=True) == ([31.0] * 4, 3, b)


def refused(call: Any, status: str, text: str) -> None:
    with pytest.raises(InferenceServerException) as err:
        call()
    assert text in err.value.message(), err.value.message()
    assert status in str(err.value.status())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unknown_ended_and_malformed_sequences_are_refused(server: ServerProcess, protocol: str) -> None:
    s = Session(server, protocol)
    bad = "400" if protocol == "http" else "INVALID_ARGUMENT"
    refused(lambda: s.send(999, 1.0), bad, "must specify the START flag")
    seq = 301 if protocol == "http" else 302
    s.send(seq, 1.0, start=True, end=True)
    refused(lambda: s.send(seq, 1.0), bad, f"sequence {seq} is not active")
    refused(lambda: s.send(0, 1.0, start=True), bad, "must specify a non-zero or non-empty correlation ID")
    refused(lambda: s.send("text-id", 1.0, start=True), bad, "takes a UINT64 correlation id")
    two = s.m.InferInput("X", [2, 4], "FP32")
    two.set_data_from_numpy(np.ones((2, 4), np.float32))
    refused(
        lambda: s.c.infer("running_stats", [two], sequence_id=5, sequence_start=True), bad, "batch-size 1"
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_correlation_ids(server: ServerProcess, protocol: str) -> None:
    """Triton's simple_string_dyna_sequence (implicit state here): a running sum, plus the
    numeric value of the string id on the last request."""
    m = httpclient if protocol == "http" else grpcclient
    c = m.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    seq = "4001" if protocol == "http" else "4002"
    got = []
    for i, v in enumerate((5, 7, 9)):
        inp = m.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[v]], np.int32))
        r = c.infer(
            "simple_string_dyna_sequence", [inp], sequence_id=seq, sequence_start=i == 0, sequence_end=i == 2
        )
        got.append(int(r.as_numpy("OUTPUT")[0][0]))
    assert got == [5, 12, 21 + int(seq)]


def test_stream_keeps_each_sequence_in_order_and_batches_sequences(server: ServerProcess) -> None:
    results: queue.Queue[Any] = queue.Queue()
    seqs = (501, 502, 503)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        before = c.get_inference_statistics("running_batched").model_stats[0]
        c.start_stream(callback=lambda result, error: results.put(error or result))
        for step in range(6):  # interleaved: every sequence has requests in flight together
            for seq in seqs:
                inp = grpcclient.InferInput("X", [1, 4], "FP32")
                inp.set_data_from_numpy(np.full((1, 4), float(seq % 10), np.float32))
                c.async_stream_infer(
                    "running_batched",
                    [inp],
                    request_id=f"{seq}_{step}",
                    sequence_id=seq,
                    sequence_start=step == 0,
                    sequence_end=step == 5,
                )
        answers: dict[int, list[tuple[int, float]]] = {s: [] for s in seqs}
        for _ in range(6 * len(seqs)):
            item = results.get(timeout=60)
            assert not isinstance(item, InferenceServerException), item
            seq, step = map(int, item.get_response().id.split("_"))
            answers[seq].append((int(item.as_numpy("COUNT")[0][0]), float(item.as_numpy("TOTAL")[0][0])))
        c.stop_stream()
        after = c.get_inference_statistics("running_batched").model_stats[0]
    for seq in seqs:  # each sequence's answers arrive in order and carry its own state
        assert answers[seq] == [(n, n * float(seq % 10)) for n in range(1, 7)]
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == 18 and executions < inferences  # sequences shared batches


def test_an_idle_sequence_is_freed(server: ServerProcess) -> None:
    """running_single has one slot: sequence 2 waits in the backlog until sequence 1 is
    released for idling 300 ms; then 1's next request must start it again."""
    s = Session(server, "http", "running_single")
    assert s.send(601, 1.0, start=True)[1] == 1
    done: list[Any] = []
    other = Session(server, "http", "running_single")
    waiting = threading.Thread(target=lambda: done.append(other.send(602, 5.0, start=True)))
    waiting.start()
    waiting.join(60)  # returns once 601 idled out (its slot went to 602)
    assert done == [([5.0] * 4, 1, 602)]
    refused(lambda: s.send(601, 1.0), "400", "idle longer than max_sequence_idle_microseconds (300000)")
    s.send(602, 1.0, end=True)


def test_triton_simple_sequence(server: ServerProcess) -> None:
    """Triton's own stateless sequence model: OUTPUT = (INPUT + START) * READY."""
    c = httpclient.InferenceServerClient(server.http_url)
    out = []
    for i, v in enumerate((4, 5, 6)):
        inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[v]], np.int32))
        r = c.infer("simple_sequence", [inp], sequence_id=77, sequence_start=i == 0, sequence_end=i == 2)
        out.append(int(r.as_numpy("OUTPUT")[0][0]))
    assert out == [5, 5, 6]
    config = c.get_model_config("simple_sequence")
    assert config["sequence_batching"]["control_input"][0]["name"] == "START"
    assert "sequence" in c.get_server_metadata()["extensions"]
