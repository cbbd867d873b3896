"""System shared memory with Triton's clients (tritonclient HTTP and gRPC) against a real
server: inputs read from regions, outputs written into them, strings, bounds, the key
prefix, CUDA answering not supported, a region unregistered while a request uses it, and
a server without the extension refusing it."""

from __future__ import annotations

import queue
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from milliserve.examples.triton import build_triton_examples
from milliserve.testing import ServerProcess, SharedMemoryObject, wait_until
from tests.support.probes import pending_requests

pytestmark = pytest.mark.e2e

PREFIX = "/ms_e2e_"
# simple, but every batch waits 2 s first (runtime/stall.py): a request stays in flight
SLOW = (
    'parameters [ { key: "test_stall_ms" value: { string_value: "2000" } }, '
    '{ key: "test_stall_probability" value: { string_value: "1" } } ]\n'
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("shm")
    build_triton_examples(repo, ["simple", "simple_string"])
    slow = repo / "simple_slow"
    (slow / "1").mkdir(parents=True)
    (slow / "1" / "model.onnx").write_bytes((repo / "simple" / "1" / "model.onnx").read_bytes())
    config = (repo / "simple" / "config.pbtxt").read_text().replace('"simple"', '"simple_slow"')
    (slow / "config.pbtxt").write_text(config + SLOW)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(repo, "--shared-memory", "system", "--shared-memory-key-prefix", PREFIX) as proc:
        yield proc


@pytest.fixture
def shm() -> Iterator[Callable[[int], SharedMemoryObject]]:
    made: list[SharedMemoryObject] = []

    def make(size: int) -> SharedMemoryObject:
        made.append(SharedMemoryObject(f"{PREFIX}{uuid.uuid4().hex[:12]}", size))
        return made[-1]

    yield make
    for obj in made:
        obj.close()


def serialized(items: list[bytes]) -> bytes:
    """BYTES elements as the wire (and a shared-memory region) holds them."""
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def io(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def output_meta(result: Any, name: str) -> tuple[str, list[int]]:
    out = result.get_output(name)
    if isinstance(out, dict):  # HTTP
        assert "data" not in out and "binary_data_size" not in out.get("parameters", {})
        return out["datatype"], list(out["shape"])
    return out.datatype, list(out.shape)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_travel_through_shared_memory(
    server: ServerProcess, shm: Callable[[int], SharedMemoryObject], protocol: str
) -> None:
    c, m = client(server, protocol), io(protocol)
    tag = protocol
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, np.int32)
    inputs_obj, outputs_obj = shm(128), shm(128 + 64)
    inputs_obj.write(a.tobytes() + b.tobytes())
    c.register_system_shared_memory(f"in_{tag}", inputs_obj.key, 128)
    c.register_system_shared_memory(f"out_{tag}", outputs_obj.key, 128, offset=64)
    try:
        status = c.get_system_shared_memory_status(f"in_{tag}")
        if protocol == "http":
            assert status == [{"name": f"in_{tag}", "key": inputs_obj.key, "offset": 0, "byte_size": 128}]
        else:
            assert status.regions[f"in_{tag}"].byte_size == 128
        ins = [m.InferInput("INPUT0", [1, 16], "INT32"), m.InferInput("INPUT1", [1, 16], "INT32")]
        ins[0].set_shared_memory(f"in_{tag}", 64)
        ins[1].set_shared_memory(f"in_{tag}", 64, offset=64)
        outs = [m.InferRequestedOutput("OUTPUT0"), m.InferRequestedOutput("OUTPUT1")]
        outs[0].set_shared_memory(f"out_{tag}", 64)
        outs[1].set_shared_memory(f"out_{tag}", 64, offset=64)
        result = c.infer("simple", ins, outputs=outs)
        assert output_meta(result, "OUTPUT0") == ("INT32", [1, 16])
        # the window starts at byte 64 of the object
        np.testing.assert_array_equal(np.frombuffer(outputs_obj.read(64, 64), np.int32), (a + b)[0])
        np.testing.assert_array_equal(np.frombuffer(outputs_obj.read(64, 128), np.int32), (a - b)[0])
        # an input in shared memory with the output in the answer, as usual
        plain = c.infer("simple", ins, outputs=[m.InferRequestedOutput("OUTPUT0")])
        np.testing.assert_array_equal(plain.as_numpy("OUTPUT0"), a + b)
    finally:
        c.unregister_system_shared_memory(f"in_{tag}")
        c.unregister_system_shared_memory(f"out_{tag}")
    assert f"in_{tag}" not in str(c.get_system_shared_memory_status())


def test_stream_requests_in_shared_memory(
    server: ServerProcess, shm: Callable[[int], SharedMemoryObject]
) -> None:
    """ModelStreamInfer: each request reads its inputs from, and writes its output into, its
    own window of one region."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    obj = shm(4 * 192)
    for i in range(4):
        obj.write(a.tobytes() + np.full((1, 16), i, np.int32).tobytes(), i * 192)
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.register_system_shared_memory("stream", obj.key, 4 * 192)
        try:
            c.start_stream(callback=lambda result, error: results.put(error or result))
            for i in range(4):
                ins = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
                ins[0].set_shared_memory("stream", 64, offset=i * 192)
                ins[1].set_shared_memory("stream", 64, offset=i * 192 + 64)
                out = grpcclient.InferRequestedOutput("OUTPUT1")
                out.set_shared_memory("stream", 64, offset=i * 192 + 128)
                c.async_stream_infer("simple", ins, outputs=[out], request_id=str(i))
            for _ in range(4):
                item = results.get(timeout=60)
                assert not isinstance(item, InferenceServerException), item
            c.stop_stream()
        finally:
            c.unregister_system_shared_memory("stream")
    for i in range(4):
        np.testing.assert_array_equal(np.frombuffer(obj.read(64, i * 192 + 128), np.int32), (a - i)[0])


def mapped(pid: int, obj: SharedMemoryObject) -> bool:
    """Whether process ``pid`` maps ``obj`` (an unregistered region no request holds is not)."""
    return str(obj.path) in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrent_callers_each_get_their_own_answer_in_their_own_region(
    server: ServerProcess, shm: Callable[[int], SharedMemoryObject], protocol: str
) -> None:
    """Eight callers at once, each with its regions: requests that arrive together share a
    run (the express lane's loop-turn batch, which shared memory takes as sockets do), and
    each answer is written into its caller's region, not a neighbour's. Once every region
    is unregistered, none stays mapped: every request released what it held."""
    assert server.proc is not None
    callers, calls = 8, 40
    objects = [(shm(128), shm(128)) for _ in range(callers)]
    failures: list[BaseException] = []

    def caller(i: int) -> None:
        c, m = client(server, protocol), io(protocol)
        tag = f"cc_{protocol}_{i}"
        inputs_obj, outputs_obj = objects[i]
        try:
            c.register_system_shared_memory(f"{tag}_in", inputs_obj.key, 128)
            c.register_system_shared_memory(f"{tag}_out", outputs_obj.key, 128)
            for k in range(calls):
                a = np.full((1, 16), i * 1000 + k, np.int32)
                b = np.arange(16, dtype=np.int32).reshape(1, 16)
                inputs_obj.write(a.tobytes() + b.tobytes())
                ins = [m.InferInput("INPUT0", [1, 16], "INT32"), m.InferInput("INPUT1", [1, 16], "INT32")]
                ins[0].set_shared_memory(f"{tag}_in", 64)
                ins[1].set_shared_memory(f"{tag}_in", 64, offset=64)
                outs = [m.InferRequestedOutput("OUTPUT0"), m.InferRequestedOutput("OUTPUT1")]
                outs[0].set_shared_memory(f"{tag}_out", 64)
                outs[1].set_shared_memory(f"{tag}_out", 64, offset=64)
                c.infer("simple", ins, outputs=outs)
                np.testing.assert_array_equal(np.frombuffer(outputs_obj.read(64), np.int32), (a + b)[0])
                np.testing.assert_array_equal(np.frombuffer(outputs_obj.read(64, 64), np.int32), (a - b)[0])
        except BaseException as exc:  # shown by the assertion below
            failures.append(exc)
        finally:
            for name in (f"{tag}_in", f"{tag}_out"):
                try:
                    c.unregister_system_shared_memory(name)
                except InferenceServerException as exc:
                    failures.append(exc)
            c.close()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    pid = server.proc.pid

    def still_mapped() -> list[str]:
        return [o.key for pair in objects for o in pair if mapped(pid, o)]

    wait_until(lambda: not still_mapped(), 30, "every region unmapped once unregistered")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_strings_in_shared_memory(
    server: ServerProcess, shm: Callable[[int], SharedMemoryObject], protocol: str
) -> None:
    c, m = client(server, protocol), io(protocol)
    raw_x, raw_ones = serialized([str(i).encode() for i in range(16)]), serialized([b"1"] * 16)
    obj, out = shm(len(raw_x) + len(raw_ones)), shm(512)
    obj.write(raw_x + raw_ones)
    c.register_system_shared_memory(f"s_{protocol}", obj.key, len(raw_x) + len(raw_ones))
    c.register_system_shared_memory(f"so_{protocol}", out.key, 512)
    try:
        ins = [m.InferInput("INPUT0", [1, 16], "BYTES"), m.InferInput("INPUT1", [1, 16], "BYTES")]
        ins[0].set_shared_memory(f"s_{protocol}", len(raw_x))
        ins[1].set_shared_memory(f"s_{protocol}", len(raw_ones), offset=len(raw_x))
        o = m.InferRequestedOutput("OUTPUT0")
        o.set_shared_memory(f"so_{protocol}", 512)
        c.infer("simple_string", ins, outputs=[o])
        expected = serialized([str(i + 1).encode() for i in range(16)])
        assert out.read(len(expected)) == expected
    finally:
        c.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bounds_keys_and_cuda(
    server: ServerProcess, shm: Callable[[int], SharedMemoryObject], protocol: str
) -> None:
    c, m = client(server, protocol), io(protocol)
    obj = shm(128)
    name = f"b_{protocol}"

    def refused(call: Callable[[], Any], status: str, text: str) -> None:
        with pytest.raises(InferenceServerException) as err:
            call()
        assert text in err.value.message(), err.value.message()
        assert status in str(err.value.status()), err.value.status()

    bad_request = "400" if protocol == "http" else "INVALID_ARGUMENT"
    refused(lambda: c.register_system_shared_memory(name, obj.key, 129), bad_request, "beyond the 128 bytes")
    refused(
        lambda: c.register_system_shared_memory(name, "/not_ours", 8),
        "403" if protocol == "http" else "PERMISSION_DENIED",
        f"does not start with '{PREFIX}'",
    )
    refused(
        lambda: c.register_cuda_shared_memory("g", b"\0" * 64, 0, 64),
        "501" if protocol == "http" else "UNIMPLEMENTED",
        "CUDA shared memory is not supported",
    )
    c.unregister_cuda_shared_memory()  # nothing registered: fine, as Triton
    c.register_system_shared_memory(name, obj.key, 128)
    try:
        ins = [m.InferInput("INPUT0", [1, 16], "INT32"), m.InferInput("INPUT1", [1, 16], "INT32")]
        ins[0].set_shared_memory(name, 64)
        ins[1].set_shared_memory(name, 64, offset=100)  # runs past the region's 128 bytes
        refused(lambda: c.infer("simple", ins), bad_request, "Invalid offset + byte size")
        ins[1].set_shared_memory(name, 60, offset=64)  # not 16 INT32s
        refused(lambda: c.infer("simple", ins), bad_request, "shared_memory_byte_size is 60")
        ins[1].set_shared_memory(name, 64, offset=64)
        small = m.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory(name, 32)
        refused(lambda: c.infer("simple", ins, outputs=[small]), bad_request, "should be at least 64 bytes")
        gone = m.InferRequestedOutput("OUTPUT0")
        gone.set_shared_memory("never_registered", 64)
        refused(
            lambda: c.infer("simple", ins, outputs=[gone]), bad_request, "Unable to find shared memory region"
        )
    finally:
        c.unregister_system_shared_memory(name)
    assert c.is_server_live()


def test_a_region_unregistered_while_a_request_uses_it(
    server: ServerProcess, shm: Callable[[int], SharedMemoryObject]
) -> None:
    c = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    obj = shm(256)
    obj.write(a.tobytes() + a.tobytes())
    c.register_system_shared_memory("busy", obj.key, 256)
    ins = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    ins[0].set_shared_memory("busy", 64)
    ins[1].set_shared_memory("busy", 64, offset=64)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("busy", 64, offset=128)
    results: list[Any] = []

    def call() -> None:
        try:
            results.append(
                httpclient.InferenceServerClient(server.http_url).infer("simple_slow", ins, outputs=[out])
            )
        except Exception as exc:  # the assertion below shows it
            results.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    wait_until(
        lambda: pending_requests(server.metrics_url, "simple_slow").get("", 0) > 0,
        what="the request in flight",
    )
    c.unregister_system_shared_memory("busy")  # while the model holds the request (a 2 s stall)
    assert c.get_system_shared_memory_status() == []
    worker.join(60)
    assert len(results) == 1 and not isinstance(results[0], Exception), results
    np.testing.assert_array_equal(np.frombuffer(obj.read(64, 128), np.int32), (a + a)[0])
    # the server goes on; the name is free again
    c.register_system_shared_memory("busy", obj.key, 256)
    c.unregister_system_shared_memory("busy")
    assert c.is_server_ready()


def test_off_by_default(tmp_path: Path, shm: Callable[[int], SharedMemoryObject]) -> None:
    build_triton_examples(tmp_path, ["simple"])
    obj = shm(128)
    with ServerProcess(tmp_path) as proc:
        for c in (
            httpclient.InferenceServerClient(proc.http_url),
            grpcclient.InferenceServerClient(proc.grpc_url),
        ):
            with pytest.raises(InferenceServerException, match="shared memory is off"):
                c.register_system_shared_memory("r", obj.key, 128)
            with pytest.raises(InferenceServerException, match="shared memory is off"):
                c.get_system_shared_memory_status()
        meta = httpclient.InferenceServerClient(proc.http_url).get_server_metadata()
        assert "system_shared_memory" not in meta["extensions"]
