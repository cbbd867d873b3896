"""Length buckets (pipeline/buckets.py): which batches split, into what, and that the
pieces put back together pool to the same vectors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from milliserve.cache.response_cache import CacheFactory
from milliserve.config.model_config import ModelConfig
from milliserve.pipeline import buckets
from milliserve.pipeline.ensemble import build_steps
from milliserve.pipeline.pooling import pool
from milliserve.pipeline.steps import ModelCall, tensor
from milliserve.protocol.types import InferRequest, InferResponse, InferTensor
from milliserve.road import Call


def _mask(lengths: list[int], seq: int | None = None, left: bool = False) -> np.ndarray:
    seq = seq or max(lengths)
    m = np.zeros((len(lengths), seq), dtype=np.int64)
    for i, n in enumerate(lengths):
        if left:
            m[i, seq - n :] = 1
        else:
            m[i, :n] = 1
    return m


def test_a_padded_batch_splits_into_runs_of_similar_length() -> None:
    rng = np.random.default_rng(1)
    lengths = [int(x) for x in rng.integers(5, 60, 32)]
    runs = buckets.plan(_mask(lengths))
    assert runs is not None
    rows = np.concatenate([r for r, _ in runs])
    assert sorted(rows.tolist()) == list(range(32))  # every row once
    assert [len(r) for r, _ in runs] == [buckets.ROWS] * 4
    widths = [w for _, w in runs]
    assert widths == sorted(widths) and widths[-1] == max(lengths)
    for r, w in runs:
        assert max(lengths[i] for i in r) == w
    padded = sum(len(r) * w for r, w in runs)
    assert padded < 32 * max(lengths)


def test_a_short_last_run_joins_the_one_before() -> None:
    runs = buckets.plan(_mask(list(range(1, 20))))  # 19 rows: 8, then 11
    assert runs is not None and [len(r) for r, _ in runs] == [8, 11]


def test_batches_that_run_as_one() -> None:
    assert buckets.plan(_mask([3, 50] * 7)) is None  # under MIN_ROWS
    assert buckets.plan(_mask([30] * 31 + [32])) is None  # little padding
    assert buckets.plan(_mask(list(range(1, 33)), left=True)) is None  # padded on the left
    assert buckets.plan(np.zeros((32, 4), dtype=np.int64)) is None  # nothing attended


def test_runs_put_back_pool_as_the_whole_batch() -> None:
    rng = np.random.default_rng(2)
    lengths = [int(x) for x in rng.integers(1, 40, 24)]
    mask = _mask(lengths, seq=45)
    hidden = rng.standard_normal((24, 45, 6)).astype(np.float32)
    runs = buckets.plan(mask)
    assert runs is not None
    # an encoder's answer for a run: the rows' states up to the run's width
    parts = [(rows, hidden[rows, :width]) for rows, width in runs]
    back = buckets.scatter(parts, 24, 45)
    assert back.shape == hidden.shape and back.dtype == hidden.dtype
    for mode in ("mean", "cls", "last_token"):
        np.testing.assert_allclose(pool(back, mask, mode), pool(hidden, mask, mode), rtol=1e-6)


class Encoder:
    """A stand-in encoder: each token's state is (its id, its position, 1), so a row's
    states depend on that row alone, as a transformer's do under its attention mask."""

    def __init__(self, dims: list[int]) -> None:
        spec = {"data_type": "TYPE_INT64", "dims": dims}
        self.config = ModelConfig(
            name="enc",
            max_batch_size=64,
            input=[{"name": "input_ids", **spec}, {"name": "attention_mask", **spec}],
            output=[{"name": "states", "data_type": "TYPE_FP32", "dims": [-1, 3]}],
        )
        self.widths: list[tuple[int, int]] = []

    def client_inputs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(t.name, t.data_type, t.dims) for t in self.config.input]

    async def infer(self, request: InferRequest) -> InferResponse:
        ids = np.asarray(request.inputs[0].data)
        self.widths.append(ids.shape)
        pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        states = np.stack([ids, pos, np.ones_like(ids)], -1).astype(np.float32)
        return InferResponse("enc", "1", [InferTensor("states", "FP32", states.shape, states)])


def _embedder(dims: list[int], pooling: str = "mean", states_out: bool = False) -> ModelConfig:
    """ids and mask -> the encoder -> pooling; ``states_out``: the states are an output too."""
    spec = {"data_type": "TYPE_INT64", "dims": dims}
    states = [{"name": "states", "data_type": "TYPE_FP32", "dims": [-1, 3]}] if states_out else []
    return ModelConfig.model_validate(
        {
            "name": "p",
            "platform": "ensemble",
            "max_batch_size": 64,
            "input": [{"name": "input_ids", **spec}, {"name": "attention_mask", **spec}],
            "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [3]}, *states],
            "ensemble_scheduling": {
                "step": [
                    {"model_name": "enc"},
                    {"pooling": {"input": "states", "mask": "attention_mask", "mode": pooling}},
                ]
            },
        }
    )


def _run(config: ModelConfig, enc: Encoder, lengths: list[int], seq: int) -> np.ndarray:
    steps = build_steps(config, Path("."), lambda name, version: enc, CacheFactory())
    mask = _mask(lengths, seq)
    ids = (mask * np.arange(1, seq + 1)[None, :] * 7 + np.arange(len(lengths))[:, None]) * mask
    tensors = {"input_ids": tensor("input_ids", ids), "attention_mask": tensor("attention_mask", mask)}
    call = Call(InferRequest("p", "", list(tensors.values())))

    async def go() -> None:
        for step in steps:
            await step.run(tensors, call)

    asyncio.run(go())
    return np.asarray(tensors["embedding"].data)


@pytest.mark.parametrize("pooling", ["mean", "cls", "last_token"])
def test_a_pipeline_pools_the_same_vectors_from_buckets(pooling: str) -> None:
    lengths = [int(x) for x in np.random.default_rng(4).integers(1, 30, 32)]
    free, fixed = Encoder([-1]), Encoder([32])
    got = _run(_embedder([-1], pooling), free, lengths, 32)
    want = _run(_embedder([32], pooling), fixed, lengths, 32)
    # a model of fixed length gets the batch as it is; one of any length, runs of 8
    assert fixed.widths == [(32, 32)]
    assert [b for b, _ in free.widths] == [8, 8, 8, 8] and max(w for _, w in free.widths) == max(lengths)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_no_buckets_where_the_states_go_elsewhere() -> None:
    config = _embedder([-1], states_out=True)
    steps = build_steps(config, Path("."), lambda name, version: Encoder([-1]), CacheFactory())
    assert isinstance(steps[0], ModelCall) and steps[0].buckets is None
    steps = build_steps(_embedder([-1]), Path("."), lambda name, version: Encoder([-1]), CacheFactory())
    assert isinstance(steps[0], ModelCall) and steps[0].buckets == ("attention_mask", "states")
