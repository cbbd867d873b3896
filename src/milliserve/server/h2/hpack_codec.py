"""HPACK (RFC 7541) header-block decoding for the HTTP/2 listener, bounded as it decodes.

A gRPC client sends the same headers on every call, and after the first call its encoder
refers to them by index only, so the very same bytes arrive again and again. A block that
changed nothing in the dynamic table decodes the same way for as long as the table is
unchanged: such blocks are kept (a few per connection) and looked up by their bytes, so the
steady state costs one dict lookup instead of a decode. The decoder is milliserve's own
because the bound on the decoded size must hold while decoding (a one-byte index can name a
4 KiB entry), and the cache needs to know whether a block touched the table; the RFC's
static table and Huffman code are in hpack_tables.py (the ``hpack`` package, the tests'
reference encoder, keeps its own in private modules).

The encoder side needs no table: the listener sends only literals without indexing
(``literal``), which never change the client's decoder state.
"""

from __future__ import annotations

from collections import deque

from milliserve.server.h2.hpack_tables import STATIC_TABLE, HuffmanError, decode_huffman

__all__ = ["HeaderBlockTooLarge", "HpackDecoder", "HpackError", "literal"]

_STATIC = STATIC_TABLE
_STATIC_LEN = len(_STATIC)
# blocks kept per connection: a client sends a handful of distinct ones (one per method, and
# the timeout varies); more would only hold memory
_CACHED_BLOCKS = 32
_ENTRY_OVERHEAD = 32  # RFC 7541 §4.1


class HpackError(Exception):
    """The block cannot be decoded: a connection error (COMPRESSION_ERROR)."""


class HeaderBlockTooLarge(Exception):
    """The decoded headers pass the limit. The block was still decoded to its end, so the
    table stays in step with the client's and the connection can go on."""


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    mask = (1 << prefix_bits) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise HpackError("header block ends inside an integer")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
        if shift > 28:  # no honest integer here passes 2**28
            raise HpackError("integer too large in header block")


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos >= len(data):
        raise HpackError("header block ends before a string")
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 7)
    end = pos + length
    if end > len(data):
        raise HpackError("header block ends inside a string")
    raw = data[pos:end]
    if huffman:
        try:
            raw = decode_huffman(raw)
        except HuffmanError as exc:
            raise HpackError(f"bad Huffman string: {exc}") from None
    return raw, end


class HpackDecoder:
    """One connection's decoder: its dynamic table, bounded by ``max_table_size`` (what the
    server's SETTINGS_HEADER_TABLE_SIZE allows), and its cache of unchanging blocks."""

    __slots__ = ("_cache", "_entries", "_generation", "_max_size", "_size", "max_table_size")

    def __init__(self, max_table_size: int = 4096) -> None:
        self.max_table_size = max_table_size
        self._max_size = max_table_size
        self._entries: deque[tuple[bytes, bytes]] = deque()
        self._size = 0
        self._generation = 0  # bumped on every change to the table
        self._cache: dict[bytes, tuple[int, list[tuple[bytes, bytes]]]] = {}

    def _add(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + _ENTRY_OVERHEAD
        self._generation += 1
        if size > self._max_size:  # an entry larger than the table empties it (§4.4)
            self._entries.clear()
            self._size = 0
            return
        self._entries.appendleft((name, value))
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self._max_size:
            name, value = self._entries.pop()
            self._size -= len(name) + len(value) + _ENTRY_OVERHEAD

    def _get(self, index: int) -> tuple[bytes, bytes]:
        if index == 0:
            raise HpackError("header index 0")
        if index <= _STATIC_LEN:
            return _STATIC[index - 1]
        index -= _STATIC_LEN + 1
        if index >= len(self._entries):
            raise HpackError("header index past the dynamic table")
        return self._entries[index]

    def decode(self, block: bytes, max_list_bytes: int) -> list[tuple[bytes, bytes]]:
        """The (name, value) pairs of ``block``. Raises HpackError (the connection must
        end) or HeaderBlockTooLarge (decoded past ``max_list_bytes``, counted as RFC 7540's
        header list size: name + value + 32 per field)."""
        hit = self._cache.get(block)
        if hit is not None and hit[0] == self._generation:
            return hit[1]
        generation = self._generation
        headers: list[tuple[bytes, bytes]] = []
        total = 0
        over = False
        pos, end = 0, len(block)
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed field
                index, pos = _integer(block, pos, 7)
                name, value = self._get(index)
            elif first & 0x40:  # literal with incremental indexing
                index, pos = _integer(block, pos, 6)
                name, pos = _string(block, pos) if index == 0 else (self._get(index)[0], pos)
                value, pos = _string(block, pos)
                self._add(name, value)
            elif first & 0x20:  # dynamic table size update, only at the start of a block (§4.2)
                if headers or over:
                    raise HpackError("a table size update after a header field")
                size, pos = _integer(block, pos, 5)
                if size > self.max_table_size:
                    raise HpackError(f"table size update to {size} over the allowed {self.max_table_size}")
                self._max_size = size
                self._generation += 1
                self._evict()
                continue
            else:  # literal without indexing (0000) or never indexed (0001)
                index, pos = _integer(block, pos, 4)
                name, pos = _string(block, pos) if index == 0 else (self._get(index)[0], pos)
                value, pos = _string(block, pos)
            total += len(name) + len(value) + _ENTRY_OVERHEAD
            if total > max_list_bytes:
                over = True  # keep decoding: the table must follow the client's
            elif not over:
                headers.append((name, value))
        if over:
            raise HeaderBlockTooLarge(f"{total} bytes of headers, over the limit of {max_list_bytes}")
        if generation == self._generation:
            if len(self._cache) >= _CACHED_BLOCKS:
                self._cache.clear()
            self._cache[bytes(block)] = (generation, headers)
        return headers


def _literal_int(value: int, prefix_bits: int, flags: int) -> bytes:
    mask = (1 << prefix_bits) - 1
    if value < mask:
        return bytes([flags | value])
    out = bytearray([flags | mask])
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """One header as a literal without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + _literal_int(len(name), 7, 0) + name + _literal_int(len(value), 7, 0) + value


# a dynamic table size update to 0 (RFC 7541 §6.3): what begins the first header block after
# the client changes its SETTINGS_HEADER_TABLE_SIZE, for an encoder that never indexes
TABLE_SIZE_ZERO = _literal_int(0, 5, 0x20)
