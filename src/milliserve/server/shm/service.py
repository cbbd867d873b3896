"""What the front ends call for shared memory: the extension's API (status, register,
unregister, for system and CUDA memory), and ``begin``, the use of regions by one
inference request (its inputs read as views of the mapping, its outputs written into the
client's regions after the data plane answered)."""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from milliserve.errors import ForbiddenError, InvalidInputError, NotFoundError, NotSupportedError, shown
from milliserve.protocol.datatypes import BYTES, oip_to_numpy
from milliserve.protocol.raw import array_to_raw, deserialize_bytes
from milliserve.protocol.types import InferRequest, InferResponse, Parameters
from milliserve.server.shm.regions import Region, RegionRegistry, check_peer

__all__ = ["SharedMemoryService", "SharedMemoryUse"]

_OFF = (
    "shared memory is off on this server: start it with --shared-memory system "
    "(for clients on the same machine only)"
)


def _where(what: str, params: Parameters) -> tuple[str, int, int]:
    """(region, offset, byte size) from a tensor's parameters; InvalidInputError naming the
    tensor when one is missing or not a valid number."""
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if type(region) is not str or not region:
        raise InvalidInputError(f"{what}: 'shared_memory_region' must name a registered region")
    # type() is: a bool is an int to isinstance, and neither true nor false is a size
    if type(size) is not int or type(offset) is not int or size < 0 or offset < 0:
        raise InvalidInputError(
            f"{what}: 'shared_memory_byte_size' and 'shared_memory_offset' must be non-negative "
            f"integers with 'shared_memory_region', got {size!r} and {offset!r}"
        )
    return region, offset, size


class SharedMemoryUse:
    """The regions one request reads and writes; ``release`` when its answer is out."""

    __slots__ = ("held", "peer", "peer_ok", "registry", "targets")

    def __init__(self, registry: RegionRegistry, peer: str | None) -> None:
        self.registry = registry
        self.peer = peer
        self.peer_ok = False
        self.held: list[Region] = []
        self.targets: dict[str, memoryview] = {}  # output name -> where it is written

    def _take(self, what: str, params: Parameters) -> memoryview:
        if not self.peer_ok:
            check_peer(self.peer)
            self.peer_ok = True
        name, offset, size = _where(what, params)
        region, buf = self.registry.acquire(name, offset, size, what)
        self.held.append(region)
        return buf

    def input(
        self, name: str, datatype: str, shape: tuple[int, ...], params: Parameters
    ) -> np.ndarray[Any, Any]:
        """The input as a read-only view of the region (BYTES elements are copied out)."""
        what = f"input {name!r}"
        buf = self._take(what, params)
        count = prod(shape)
        if datatype == BYTES:
            return deserialize_bytes(name, buf, count).reshape(shape)
        dtype = oip_to_numpy(datatype)
        if len(buf) != count * dtype.itemsize:
            raise InvalidInputError(
                f"{what}: shape {list(shape)} of {datatype} is {count * dtype.itemsize} bytes, but "
                f"shared_memory_byte_size is {len(buf)}"
            )
        arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
        arr.flags.writeable = False
        return arr

    def bind_outputs(self, request: InferRequest) -> None:
        """Take the regions the request's outputs are to be written to, before it runs (as
        its inputs' are): a bad one is refused before any compute, and a region unregistered
        meanwhile still receives the answer."""
        for o in request.outputs or ():
            if o.parameters and "shared_memory_region" in o.parameters:
                self.targets[o.name] = self._take(f"output {o.name!r}", o.parameters)

    def write_outputs(self, response: InferResponse) -> frozenset[str]:
        """Write the outputs bound by ``bind_outputs`` into their regions; returns their names."""
        if not self.targets:
            return frozenset()
        written: set[str] = set()
        for out in response.outputs:
            buf = self.targets.get(out.name)
            if buf is None:
                continue
            if out.datatype == BYTES:
                raw: Any = memoryview(array_to_raw(BYTES, out.data))
            else:  # the array's own bytes, copied once, straight into the region
                raw = np.ascontiguousarray(out.data).reshape(-1).view(np.uint8).data
            size = raw.nbytes
            if size > len(buf):
                raise InvalidInputError(
                    f"shared memory size specified with the request for output {out.name!r} "
                    f"({len(buf)} bytes) should be at least {size} bytes to hold the results"
                )
            buf[:size] = raw
            written.add(out.name)
        return frozenset(written)

    def release(self) -> None:
        self.targets.clear()
        for region in self.held:
            self.registry.release(region)
        self.held.clear()


class SharedMemoryService:
    """Triton's shared-memory extension for both front ends. ``enabled`` False: every call
    is refused (ForbiddenError) and requests naming regions too."""

    def __init__(
        self,
        enabled: bool,
        key_prefix: str = "",
        max_regions_per_client: int = 64,
        max_bytes_per_client: int = 1 << 30,
    ) -> None:
        self.enabled = enabled
        self.regions = RegionRegistry(key_prefix, max_regions_per_client, max_bytes_per_client)

    def _on(self) -> RegionRegistry:
        if not self.enabled:
            raise ForbiddenError(_OFF)
        return self.regions

    def begin(self, peer: str | None) -> SharedMemoryUse | None:
        """One request's use of regions, or None when shared memory is off."""
        return SharedMemoryUse(self.regions, peer) if self.enabled else None

    # ---- system shared memory ----
    def system_status(self, name: str, peer: str | None) -> list[dict[str, Any]]:
        return self._on().status(name, peer)

    def system_register(self, name: str, key: Any, offset: Any, byte_size: Any, peer: str | None) -> None:
        if not isinstance(key, str):
            raise InvalidInputError(f"shared memory region {shown(name)}: 'key' must be a string")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidInputError(
                    f"shared memory region {shown(name)}: {field!r} must be an integer, got {value!r}"
                )
        self._on().register(name, key, offset, byte_size, peer)

    def system_unregister(self, name: str, peer: str | None) -> None:
        self._on().unregister(name, peer)

    # ---- CUDA shared memory: none here ----
    def cuda_status(self, name: str, peer: str | None) -> list[dict[str, Any]]:
        self._on()
        check_peer(peer)
        if name:
            raise NotFoundError(f"Unable to find cuda shared memory region: {shown(name)}")
        return []

    def cuda_register(self, name: str, peer: str | None) -> None:
        self._on()
        check_peer(peer)
        raise NotSupportedError(
            f"failed to register CUDA shared memory region {shown(name)}: CUDA shared memory is not "
            "supported by milliserve; use system shared memory"
        )

    def cuda_unregister(self, name: str, peer: str | None) -> None:
        """Nothing is ever registered: unregistering succeeds, as Triton's does for an
        unknown name (the example clients clear both kinds before they start)."""
        self._on()
        check_peer(peer)

    def close(self) -> None:
        self.regions.close()
