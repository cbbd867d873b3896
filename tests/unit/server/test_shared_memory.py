"""The shared-memory region registry (server/shm) on real POSIX shared-memory objects: keys,
bounds, limits per client, peers, unregistering while a request holds a region, and the
HTTP routes from a loopback and a non-loopback client (httpx.ASGITransport)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from milliserve.config.settings import SharedMemorySettings
from milliserve.errors import ForbiddenError, InvalidInputError, NotFoundError, NotSupportedError
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from milliserve.server.shm.regions import RegionRegistry, check_peer
from milliserve.server.shm.service import SharedMemoryService
from milliserve.testing import InProcessServer, SharedMemoryObject

LOCAL = "127.0.0.1"
PREFIX = "/ms_unit_"


@pytest.fixture
def shm() -> Iterator[Callable[[int], SharedMemoryObject]]:
    """Makes shared-memory objects with unique keys under PREFIX; unlinks them after."""
    made: list[SharedMemoryObject] = []

    def make(size: int) -> SharedMemoryObject:
        obj = SharedMemoryObject(f"{PREFIX}{uuid.uuid4().hex[:12]}", size)
        made.append(obj)
        return obj

    yield make
    for obj in made:
        obj.close()


def registry(**kw: Any) -> RegionRegistry:
    return RegionRegistry(kw.pop("prefix", PREFIX), kw.pop("regions", 8), kw.pop("bytes_", 1 << 20))


def test_only_loopback_peers() -> None:
    for peer in ("127.0.0.1", "127.8.9.1", "::1", "::ffff:127.0.0.1"):
        check_peer(peer)
    for peer in ("10.1.2.3", "192.168.0.7", "2001:db8::1", "", None, "not an address"):
        with pytest.raises(ForbiddenError, match="loopback"):
            check_peer(peer)


def test_register_status_use_unregister(shm: Callable[[int], SharedMemoryObject]) -> None:
    obj = shm(4096)
    obj.write(np.arange(8, dtype=np.int32).tobytes(), 100)
    reg = registry()
    reg.register("r", obj.key, 100, 64, LOCAL)
    assert reg.status("", LOCAL) == [{"name": "r", "key": obj.key, "offset": 100, "byte_size": 64}]
    region, view = reg.acquire("r", 0, 32, "input 'x'")
    assert np.frombuffer(view, np.int32).tolist() == list(range(8))  # offset 100 of the object
    view[:4] = np.int32(-5).tobytes()
    assert obj.read(4, 100) == np.int32(-5).tobytes()  # writes reach the client's memory
    reg.release(region)
    reg.unregister("r", LOCAL)
    reg.unregister("never-registered", LOCAL)  # no error, as Triton
    assert reg.status("", LOCAL) == []
    with pytest.raises(NotFoundError, match="Unable to find system shared memory region"):
        reg.status("r", LOCAL)


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        ("no_slash", InvalidInputError, "not a POSIX shared-memory name"),
        ("/ms_unit_a/b", InvalidInputError, "not a POSIX shared-memory name"),
        ("/..", InvalidInputError, "not a POSIX shared-memory name"),
        ("/" + "x" * 300, InvalidInputError, "not a POSIX shared-memory name"),
        ("/other_prefix", ForbiddenError, "does not start with '/ms_unit_'"),
        (PREFIX + "missing", InvalidInputError, "Unable to open shared memory region"),
    ],
)
def test_keys_are_checked(key: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        registry().register("r", key, 0, 16, LOCAL)


def test_windows_and_uses_are_checked_against_the_object(shm: Callable[[int], SharedMemoryObject]) -> None:
    obj = shm(1024)
    reg = registry()
    for offset, size in ((1000, 100), (0, 0), (-1, 10), (0, 1 << 40)):
        with pytest.raises(InvalidInputError, match="failed to register"):
            reg.register("r", obj.key, offset, size, LOCAL)
    reg.register("r", obj.key, 512, 512, LOCAL)
    with pytest.raises(InvalidInputError, match="already in manager"):
        reg.register("r", obj.key, 0, 16, LOCAL)
    for offset, size in ((500, 13), (512, 1), (-4, 4), (0, -1)):
        with pytest.raises(InvalidInputError, match="Invalid offset \\+ byte size"):
            reg.acquire("r", offset, size, "input 'x'")
    with pytest.raises(InvalidInputError, match="Unable to find shared memory region"):
        reg.acquire("nope", 0, 1, "input 'x'")
    os.truncate(obj.path, 100)  # the client shrinks the object under the server
    with pytest.raises(InvalidInputError, match="truncated"):
        reg.acquire("r", 0, 4, "input 'x'")


def test_limits_per_client(shm: Callable[[int], SharedMemoryObject]) -> None:
    obj = shm(4096)
    reg = registry(regions=2, bytes_=3000)
    reg.register("a", obj.key, 0, 1000, LOCAL)
    with pytest.raises(InvalidInputError, match="limit is 2 regions and 3000 bytes per client"):
        reg.register("b", obj.key, 0, 2500, LOCAL)  # bytes
    reg.register("b", obj.key, 0, 1000, LOCAL)
    with pytest.raises(InvalidInputError, match="holds 2 regions"):
        reg.register("c", obj.key, 0, 10, LOCAL)  # count
    reg.register("c", obj.key, 0, 10, "127.0.0.2")  # another client has its own allowance
    reg.unregister("a", LOCAL)
    reg.register("d", obj.key, 0, 1000, LOCAL)  # freed by the unregister


def test_a_region_unregistered_in_use_stays_mapped_until_released(
    shm: Callable[[int], SharedMemoryObject],
) -> None:
    old, new = shm(64), shm(64)
    old.write(b"\x01" * 64)
    new.write(b"\x02" * 64)
    reg = registry()
    reg.register("r", old.key, 0, 64, LOCAL)
    region, view = reg.acquire("r", 0, 64, "output 'y'")
    reg.unregister("r", LOCAL)  # while the request holds it
    assert reg.status("", LOCAL) == []
    reg.register("r", new.key, 0, 64, LOCAL)  # the name is free at once, for another object
    view[:8] = b"\x07" * 8  # the request's write lands in the object it was given, no crash
    assert old.read(8) == b"\x07" * 8 and new.read(8) == b"\x02" * 8
    assert region.fd >= 0
    reg.release(region)
    assert region.fd == -1  # released with its last user
    region2, view2 = reg.acquire("r", 0, 8, "input 'x'")
    assert bytes(view2) == b"\x02" * 8
    reg.release(region2)


def test_inputs_and_outputs_of_a_request(shm: Callable[[int], SharedMemoryObject]) -> None:
    obj = shm(256)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    obj.write(x.tobytes())
    svc = SharedMemoryService(True, PREFIX)
    svc.system_register("io", obj.key, 0, 256, LOCAL)
    use = svc.begin(LOCAL)
    assert use is not None
    params = {"shared_memory_region": "io", "shared_memory_byte_size": 24}
    got = use.input("X", "FP32", (2, 3), params)
    np.testing.assert_array_equal(got, x)
    assert not got.flags.writeable  # a view of the client's memory, read only
    with pytest.raises(InvalidInputError, match="is 24 bytes, but shared_memory_byte_size is 20"):
        use.input("X", "FP32", (2, 3), {**params, "shared_memory_byte_size": 20})
    with pytest.raises(
        InvalidInputError, match="'shared_memory_byte_size' and 'shared_memory_offset' must be non-negative"
    ):
        use.input("X", "FP32", (2, 3), {"shared_memory_region": "io"})
    y = np.full((2, 3), 9.5, np.float32)
    request = InferRequest(
        "m", "", [], outputs=[RequestedOutput("Y", {**params, "shared_memory_offset": 100})]
    )
    response = InferResponse("m", "1", [InferTensor("Y", "FP32", (2, 3), y)])
    use.bind_outputs(request)
    assert use.write_outputs(response) == {"Y"}
    assert obj.read(24, 100) == y.tobytes()
    small = InferRequest(
        "m", "", [], outputs=[RequestedOutput("Y", {**params, "shared_memory_byte_size": 8})]
    )
    use.bind_outputs(small)
    with pytest.raises(InvalidInputError, match="should be at least 24 bytes"):
        use.write_outputs(response)
    use.release()
    region, _ = svc.regions.acquire("io", 0, 1, "input 'X'")
    assert region.users == 1  # the request's holds were all released
    svc.regions.release(region)


def test_off_refuses_and_cuda_is_not_supported(shm: Callable[[int], SharedMemoryObject]) -> None:
    off = SharedMemoryService(False)
    assert off.begin(LOCAL) is None
    with pytest.raises(ForbiddenError, match="--shared-memory system"):
        off.system_register("r", "/k", 0, 1, LOCAL)
    on = SharedMemoryService(True)
    assert on.cuda_status("", LOCAL) == []
    on.cuda_unregister("", LOCAL)
    with pytest.raises(NotSupportedError, match="CUDA shared memory is not supported"):
        on.cuda_register("g", LOCAL)


def test_http_routes_from_loopback_and_remote_peers(
    tmp_path: Path, write_add_sub: Callable[..., Path], shm: Callable[[int], SharedMemoryObject], run: Any
) -> None:
    write_add_sub(tmp_path)
    obj = shm(64)
    settings = SharedMemorySettings(mode="system", key_prefix=PREFIX)

    async def main() -> None:
        async with InProcessServer(tmp_path, listen=False, shared_memory=settings) as server:
            app = server.http_app()
            local = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
            remote = httpx.ASGITransport(app=app, client=("10.20.30.40", 5000))
            async with httpx.AsyncClient(transport=local, base_url="http://t") as c:
                body = {"key": obj.key, "offset": 0, "byte_size": 64}
                r = await c.post("/v2/systemsharedmemory/region/r1/register", json=body)
                assert r.status_code == 200, r.text
                status = (await c.get("/v2/systemsharedmemory/status")).json()
                assert status == [{"name": "r1", "key": obj.key, "offset": 0, "byte_size": 64}]
                r = await c.post("/v2/cudasharedmemory/region/g/register", json={"raw_handle": {"b64": ""}})
                assert r.status_code == 501 and "not supported" in r.json()["error"]
                meta = (await c.get("/v2")).json()
                assert "system_shared_memory" in meta["extensions"]
            async with httpx.AsyncClient(transport=remote, base_url="http://t") as c:
                for call in (
                    c.get("/v2/systemsharedmemory/status"),
                    c.post("/v2/systemsharedmemory/region/r2/register", json=body),
                    c.post("/v2/systemsharedmemory/unregister"),
                ):
                    r = await call
                    assert r.status_code == 403 and "loopback" in r.json()["error"]
                ref = {"shared_memory_region": "r1", "shared_memory_byte_size": 8}
                infer = {
                    "inputs": [
                        {"name": n, "shape": [1, 2], "datatype": "FP32", "parameters": ref}
                        for n in ("INPUT0", "INPUT1")
                    ]
                }
                r = await c.post("/v2/models/add_sub/infer", json=infer)
                assert r.status_code == 403 and "loopback" in r.json()["error"]
            assert server.shared_memory.regions.status("", LOCAL)[0]["name"] == "r1"  # untouched

    run(main())
