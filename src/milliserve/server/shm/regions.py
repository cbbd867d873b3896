"""The registry of system shared-memory regions.

A client creates a POSIX shared-memory object (``shm_open``), registers a window of it
under a name (key, offset, byte size), and then names the region in its requests instead
of sending tensor bytes. The server maps each registered window once.

It is a way into another process's memory, so:

- it is off unless the server runs with ``--shared-memory system``;
- only loopback peers may register, unregister, list or use regions;
- a key must be a plain POSIX name (``/name``, no other ``/``) starting with the
  configured prefix, and is opened without following links and never created;
- the window must lie inside the object, and every use (offset, size) inside the window;
- each client (peer address) may hold a bounded number of regions and bytes;
- a region unregistered while requests use it stays mapped until the last of them ends;
  its name is free at once. A client that shrinks an object it registered is refused at
  the next use (its size is checked on every use).
"""

from __future__ import annotations

import ipaddress
import logging
import mmap
import os
import stat
import sys
import threading
from dataclasses import dataclass
from typing import Any

from milliserve.errors import ForbiddenError, InvalidInputError, NotFoundError, NotSupportedError, shown

__all__ = ["SHM_DIR", "Region", "RegionRegistry", "check_peer"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"  # where Linux's shm_open keeps its objects
MAX_NAME = 256
MAX_KEY = 255  # NAME_MAX, leading '/' included


_LOOPBACK: dict[str, str] = {}  # peer addresses found to be loopback ones (checked per request)


def check_peer(peer: str | None) -> str:
    """The client's address, or ForbiddenError when it is not a loopback one."""
    known = _LOOPBACK.get(peer) if peer else None
    if known is not None:
        return known
    if peer:
        try:
            addr = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            addr = None
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if addr is not None and addr.is_loopback:
            if len(_LOOPBACK) < 1024:
                _LOOPBACK[peer] = str(addr)
            return str(addr)
    raise ForbiddenError(
        f"shared memory is only for clients on this machine (loopback); {shown(peer or 'unknown')} is not"
    )


@dataclass(slots=True, eq=False)
class Region:
    """A registered window of a shared-memory object, mapped."""

    name: str
    key: str
    offset: int
    byte_size: int
    client: str
    view: memoryview  # the window: byte 0 is the object's byte ``offset``
    fd: int
    users: int = 0  # requests using it now
    gone: bool = False  # unregistered: released when the last user ends

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class RegionRegistry:
    """Registered regions by name, with the limits per client. Thread-safe: request bodies
    may be decoded off the event loop."""

    def __init__(self, key_prefix: str, max_regions_per_client: int, max_bytes_per_client: int) -> None:
        self.key_prefix = key_prefix
        self.max_regions = max_regions_per_client
        self.max_bytes = max_bytes_per_client
        self._regions: dict[str, Region] = {}
        self._held: dict[str, tuple[int, int]] = {}  # client -> (regions, bytes)
        self._lock = threading.Lock()

    # ---- the API ----
    def register(self, name: str, key: str, offset: int, byte_size: int, peer: str | None) -> None:
        client = check_peer(peer)
        self._check_name(name)
        self._check_key(key)
        if offset < 0 or byte_size <= 0:
            raise InvalidInputError(
                f"failed to register shared memory region {shown(name)}: offset must be >= 0 and "
                f"byte_size > 0, got offset {offset} and byte_size {byte_size}"
            )
        with self._lock:
            if name in self._regions:
                raise InvalidInputError(f"shared memory region {shown(name)} already in manager")
            count, held = self._held.get(client, (0, 0))
            if count + 1 > self.max_regions or held + byte_size > self.max_bytes:
                raise InvalidInputError(
                    f"failed to register shared memory region {shown(name)}: client {client} holds "
                    f"{count} regions of {held} bytes; the limit is {self.max_regions} regions and "
                    f"{self.max_bytes} bytes per client (unregister some first)"
                )
            region = self._map(name, key, offset, byte_size, client)
            self._regions[name] = region
            self._held[client] = (count + 1, held + byte_size)
        log.debug("registered shared memory region %r (%s, %d bytes at %d)", name, key, byte_size, offset)

    def unregister(self, name: str, peer: str | None) -> None:
        """Unregister ``name`` (every region when empty). An unknown name is no error (Triton)."""
        check_peer(peer)
        with self._lock:
            names = [name] if name else list(self._regions)
            for n in names:
                region = self._regions.pop(n, None)
                if region is None:
                    continue
                region.gone = True
                count, held = self._held.pop(region.client, (1, region.byte_size))
                if count > 1:
                    self._held[region.client] = (count - 1, held - region.byte_size)
                if region.users == 0:
                    self._free(region)

    def status(self, name: str, peer: str | None) -> list[dict[str, Any]]:
        check_peer(peer)
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise NotFoundError(f"Unable to find system shared memory region: {shown(name)}")
        return [region.status()]

    # ---- requests ----
    def acquire(self, name: str, offset: int, byte_size: int, what: str) -> tuple[Region, memoryview]:
        """The bytes ``[offset, offset + byte_size)`` of region ``name``, held for a request
        until ``release``. ``what`` names the tensor in errors."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise InvalidInputError(f"{what}: Unable to find shared memory region: {shown(name)}")
            if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
                raise InvalidInputError(
                    f"{what}: Invalid offset + byte size for shared memory region {shown(name)}: "
                    f"offset {offset} + byte_size {byte_size} is outside its {region.byte_size} bytes"
                )
            try:
                size = os.fstat(region.fd).st_size
            except OSError:
                size = -1
            if size < region.offset + region.byte_size:
                raise InvalidInputError(
                    f"{what}: shared memory region {shown(name)} (key {region.key!r}) was truncated to "
                    f"{size} bytes since it was registered; register it again"
                )
            region.users += 1
        return region, region.view[offset : offset + byte_size]

    def release(self, region: Region) -> None:
        with self._lock:
            region.users -= 1
            if region.gone and region.users == 0:
                self._free(region)

    def close(self) -> None:
        """Unregister everything (server shutdown)."""
        with self._lock:
            for region in self._regions.values():
                region.gone = True
                if region.users == 0:
                    self._free(region)
            self._regions.clear()
            self._held.clear()

    def __len__(self) -> int:
        return len(self._regions)

    # ---- mapping ----
    @staticmethod
    def _check_name(name: str) -> None:
        if not name or len(name) > MAX_NAME or not name.isprintable():
            raise InvalidInputError(
                f"shared memory region name {shown(name)} must be 1 to {MAX_NAME} printable characters"
            )

    def _check_key(self, key: str) -> None:
        plain = key.startswith("/") and "/" not in key[1:] and key not in ("/", "/.", "/..")
        if not plain or len(key) > MAX_KEY or "\x00" in key:
            raise InvalidInputError(
                f"shared memory key {shown(key)} is not a POSIX shared-memory name: '/' followed by "
                f"1 to {MAX_KEY - 1} characters, none of them '/'"
            )
        if not key.startswith(self.key_prefix):
            raise ForbiddenError(
                f"shared memory key {shown(key)} does not start with {self.key_prefix!r}, the prefix "
                "this server allows (--shared-memory-key-prefix)"
            )

    @staticmethod
    def _map(name: str, key: str, offset: int, byte_size: int, client: str) -> Region:
        if not sys.platform.startswith("linux"):
            raise NotSupportedError("system shared memory is supported on Linux only")
        path = f"{SHM_DIR}/{key[1:]}"
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise InvalidInputError(
                f"failed to register shared memory region {shown(name)}: Unable to open shared memory "
                f"region: {key!r} ({exc.strerror})"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidInputError(
                    f"failed to register shared memory region {shown(name)}: {key!r} is not a "
                    "shared-memory object"
                )
            if offset + byte_size > st.st_size:
                raise InvalidInputError(
                    f"failed to register shared memory region {shown(name)}: offset {offset} + "
                    f"byte_size {byte_size} is beyond the {st.st_size} bytes of {key!r}"
                )
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            mm = mmap.mmap(fd, offset + byte_size - start, mmap.MAP_SHARED, prot, offset=start)
        except BaseException:
            os.close(fd)
            raise
        view = memoryview(mm)[offset - start : offset - start + byte_size]
        return Region(name, key, offset, byte_size, client, view, fd)

    @staticmethod
    def _free(region: Region) -> None:
        """Drop the registry's hold on the mapping. The memory is unmapped when the last
        array viewing it is gone (an answer still being encoded keeps it alive)."""
        region.view = memoryview(b"")
        if region.fd >= 0:
            os.close(region.fd)
            region.fd = -1
