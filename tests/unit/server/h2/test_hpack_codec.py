"""The HPACK decoder of the gRPC listener: RFC 7541's own examples, blocks from a real
encoder (hpack's, with its dynamic table in play), the bound on decoded size, and the
cache of unchanging blocks."""

from __future__ import annotations

import random

import pytest
from hpack import Encoder

from milliserve.server.h2.hpack_codec import HeaderBlockTooLarge, HpackDecoder, HpackError, literal

LIMIT = 1 << 20


def test_rfc7541_c4_requests_with_huffman() -> None:
    d = HpackDecoder()
    first = bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")
    assert d.decode(first, LIMIT) == [
        (b":method", b"GET"),
        (b":scheme", b"http"),
        (b":path", b"/"),
        (b":authority", b"www.example.com"),
    ]
    second = bytes.fromhex("828684be5886a8eb10649cbf")
    assert d.decode(second, LIMIT)[-1] == (b"cache-control", b"no-cache")
    third = bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf")
    got = d.decode(third, LIMIT)
    assert got[-1] == (b"custom-key", b"custom-value")
    assert got[3] == (b":authority", b"www.example.com")


def test_blocks_of_a_real_encoder_decode_through_table_changes() -> None:
    rng = random.Random(7)
    enc, dec = Encoder(), HpackDecoder()
    for i in range(300):
        headers = [
            (b":method", b"POST"),
            (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
            (b"grpc-timeout", f"{rng.randint(1, 999)}m".encode()),
            (
                f"x-meta-{rng.randint(0, 40)}".encode(),
                bytes(rng.choice(b"abcxyz") for _ in range(rng.randint(0, 300))),
            ),
        ]
        if i % 50 == 0:
            enc.header_table_size = rng.choice([0, 256, 4096])
        block = enc.encode(headers, huffman=bool(i % 2))
        assert dec.decode(block, LIMIT) == headers


def test_an_unchanging_block_is_served_from_the_cache_but_never_a_stale_one() -> None:
    enc, dec = Encoder(), HpackDecoder()
    headers = [(b":path", b"/a"), (b"x-id", b"1")]
    dec.decode(enc.encode(headers), LIMIT)  # the first inserts into the table
    again = enc.encode(headers)  # indexed only: the same bytes every time
    assert dec.decode(again, LIMIT) == headers
    assert dec.decode(again, LIMIT) is dec.decode(again, LIMIT)
    # a new entry shifts the dynamic indexes: the same bytes now mean something else
    dec.decode(enc.encode([(b"x-other", b"2")]), LIMIT)
    assert dec.decode(again, LIMIT) != headers


def test_over_the_limit_is_refused_but_the_table_stays_in_step() -> None:
    enc, dec = Encoder(), HpackDecoder()
    big = [(b"x-big", b"v" * 2000), (b"x-small", b"1")]
    with pytest.raises(HeaderBlockTooLarge):
        dec.decode(enc.encode(big), 1024)
    assert dec.decode(enc.encode(big), LIMIT) == big  # indexes into entries the refused block added


@pytest.mark.parametrize(
    "block",
    [b"\x80", b"\xff\xff\xff\xff\xff\xff\x0f", b"\x40\x85abc", b"\xbf", b"\x3f\xe1\x3f"],
)
def test_broken_blocks_are_errors(block: bytes) -> None:
    with pytest.raises(HpackError):
        HpackDecoder().decode(block, LIMIT)


def test_literal_is_what_a_decoder_reads() -> None:
    assert HpackDecoder().decode(literal(b"grpc-status", b"0") + literal(b"k", b"v" * 300), LIMIT) == [
        (b"grpc-status", b"0"),
        (b"k", b"v" * 300),
    ]
