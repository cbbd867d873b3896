"""The ``ann`` step and its index on their own: build, save and load round trip (no pickle),
neighbours against exact search, what a load checks, the request parameter ``k``, and the
texts file reader of ``milliserve index build``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from milliserve.config.model_config import load_model_config
from milliserve.config.step_config import Ann, PipelineStep
from milliserve.errors import BackendError, ConfigError, InvalidInputError
from milliserve.pipeline.ann import OFFLOAD_ROWS, AnnStep, tensor_dim
from milliserve.pipeline.ann_index import AnnIndex, HnswParams
from milliserve.pipeline.steps import tensor
from milliserve.pipeline.text_index import read_texts
from milliserve.protocol.types import InferRequest
from milliserve.road import Call

pytest.importorskip("hnswlib")

N, DIM = 600, 32


def _vectors(n: int = N, seed: int = 0) -> np.ndarray[Any, Any]:
    x = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _exact(db: np.ndarray[Any, Any], q: np.ndarray[Any, Any], k: int) -> np.ndarray[Any, Any]:
    return np.argsort(-(q @ db.T), axis=1, kind="stable")[:, :k]


TEXTS = [f"tweet {i} café ☕" if i % 7 == 0 else f"tweet {i}" for i in range(N)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray[Any, Any]]:
    db = _vectors()
    path = tmp_path_factory.mktemp("ann") / "tweets.index"
    AnnIndex.build(db, TEXTS, np.arange(N) + 1000, HnswParams(m=16, ef=64), model="enc").save(path)
    return path, db


def test_round_trip_keeps_ids_texts_and_neighbours(saved: tuple[Path, np.ndarray[Any, Any]]) -> None:
    path, db = saved
    assert {p.name for p in path.parent.iterdir()} == {
        "tweets.index",
        "tweets.index.json",
        "tweets.index.npz",
    }
    meta = json.loads(path.with_name("tweets.index.json").read_text())
    assert meta["library"] == "hnswlib" and meta["dim"] == DIM and meta["count"] == N
    assert meta["model"] == "enc" and meta["metric"] == "ip" and meta["params"]["m"] == 16
    index = AnnIndex.load(path)
    queries = _vectors(50, seed=1)
    rows, scores = index.search(queries, 10)
    truth = _exact(db, queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows.tolist(), truth.tolist(), strict=True)])
    assert recall >= 0.95
    # scores are the inner products, best first
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ db.T, rows, 1), atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-6).all()
    # a stored vector finds itself first, with its id and text
    rows, _ = index.search(db[[0, 7, 599]], 1)
    assert rows[:, 0].tolist() == [0, 7, 599]
    assert index.ids[rows[:, 0]].tolist() == [1000, 1007, 1599]
    assert index.texts(rows[:, 0]).tolist() == [
        "tweet 0 café ☕".encode(),
        "tweet 7 café ☕".encode(),
        b"tweet 599",
    ]


def test_load_refuses_missing_or_inconsistent_files(
    saved: tuple[Path, np.ndarray[Any, Any]], tmp_path: Path
) -> None:
    path, _ = saved
    with pytest.raises(ConfigError, match=r"no file nope.index.json .*milliserve index build"):
        (tmp_path / "nope.index").write_bytes(b"")
        AnnIndex.load(tmp_path / "nope.index")
    for name in ("tweets.index", "tweets.index.npz"):
        (tmp_path / name).write_bytes(path.with_name(name).read_bytes())
    meta = json.loads(path.with_name("tweets.index.json").read_text())
    (tmp_path / "tweets.index.json").write_text(json.dumps({**meta, "format": "pickle"}))
    with pytest.raises(ConfigError, match="format 'pickle', expected 'milliserve-ann/1'"):
        AnnIndex.load(tmp_path / "tweets.index")
    (tmp_path / "tweets.index.json").write_text(json.dumps({**meta, "count": N + 1}))
    with pytest.raises(ConfigError, match=f"do not match count {N + 1}"):
        AnnIndex.load(tmp_path / "tweets.index")


def test_build_refuses_mismatched_sizes() -> None:
    with pytest.raises(ValueError, match=r"vectors \[5, 32\], 4 texts"):
        AnnIndex.build(_vectors(5), ["a"] * 4)


def _call(**parameters: Any) -> Call:
    return Call(InferRequest("search", "", [], parameters=parameters))


def _step(path: Path, offload: Any = None, input_dim: int | None = DIM, **config: Any) -> AnnStep:
    cfg = Ann.model_validate({"index": path.name, "input": "embedding", "texts": "texts", **config})
    return AnnStep("step 3 (ann)", cfg, path.parent, input_dim, offload)


def _run(step: AnnStep, x: np.ndarray[Any, Any], call: Call | None = None) -> dict[str, Any]:
    tensors = {"embedding": tensor("embedding", x)}
    asyncio.run(step.run(tensors, call or _call()))
    return {k: v for k, v in tensors.items() if k != "embedding"}


def test_step_makes_ids_scores_texts_and_takes_k_from_the_request(
    saved: tuple[Path, np.ndarray[Any, Any]],
) -> None:
    path, db = saved
    step = _step(path, k=5, max_k=20)
    assert step.stage == "ann" and step.makes == ("ids", "scores", "texts")
    out = _run(step, db[:3])
    assert out["ids"].datatype == "INT64" and out["ids"].shape == (3, 5)
    assert out["scores"].datatype == "FP32" and out["texts"].datatype == "BYTES"
    assert out["ids"].data[:, 0].tolist() == [1000, 1001, 1002]
    assert out["texts"].data[1, 0] == b"tweet 1"
    assert _run(step, db[:2], _call(k=20))["ids"].shape == (2, 20)
    assert _run(step, db[:2], _call(k=1))["scores"].shape == (2, 1)


@pytest.mark.parametrize("bad", [0, -3, 21, 2.5, "5", True, None, [1]])
def test_a_bad_k_is_a_400_naming_the_value_and_the_range(
    saved: tuple[Path, np.ndarray[Any, Any]], bad: Any
) -> None:
    step = _step(saved[0], k=5, max_k=20)
    params = {"k": bad}  # null too: leaving k out is how a request asks for the default
    with pytest.raises(
        InvalidInputError, match=r"parameter 'k' is .*; this pipeline takes an integer from 1 to 20"
    ):
        _run(step, saved[1][:1], _call(**params))


def test_load_checks_the_input_dim_and_max_k(saved: tuple[Path, np.ndarray[Any, Any]]) -> None:
    path, _ = saved
    with pytest.raises(ConfigError, match="holds 32-d vectors but 'embedding' is 384-d"):
        _step(path, input_dim=384)
    with pytest.raises(ConfigError, match=f"max_k is 1000 but index tweets.index holds {N} vectors"):
        _step(path, k=10, max_k=1000)
    with pytest.raises(
        BackendError, match=r"'embedding' is float32 \[1, 8\]; the index takes float \[batch, 32\]"
    ):
        _run(_step(path, input_dim=None), np.zeros((1, 8), np.float32))


def test_a_large_batch_is_searched_through_the_offload(saved: tuple[Path, np.ndarray[Any, Any]]) -> None:
    calls: list[int] = []

    async def offload(fn: Any, *args: Any) -> Any:
        calls.append(len(args[0]))
        return fn(*args)

    path, db = saved
    step = _step(path, offload)
    _run(step, db[:OFFLOAD_ROWS])
    assert calls == []
    out = _run(step, db[: OFFLOAD_ROWS + 1])
    assert calls == [OFFLOAD_ROWS + 1] and out["ids"].shape == (OFFLOAD_ROWS + 1, 10)


def test_ann_config_checks() -> None:
    step = PipelineStep.model_validate({"ann": {"index": "x.index"}})
    assert step.kind == "ann" and step.ann is not None
    assert (step.ann.k, step.ann.max_k, step.ann.ids, step.ann.scores, step.ann.texts) == (
        10,
        100,
        "ids",
        "scores",
        None,
    )
    with pytest.raises(ValidationError, match=r"ann\.k is 50 but ann\.max_k is 20"):
        Ann.model_validate({"index": "x", "k": 50, "max_k": 20})
    with pytest.raises(ValidationError, match="ann makes nothing"):
        Ann.model_validate({"index": "x", "ids": None, "scores": None})


def test_tensor_dim_follows_the_model_step_that_makes_the_input(tmp_path: Path) -> None:
    pipe = tmp_path / "p"
    pipe.mkdir()
    (pipe / "config.pbtxt").write_text(
        'name: "p"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input { name: "TEXT" data_type: TYPE_STRING dims: [1] }\n'
        'output { name: "ids" data_type: TYPE_INT64 dims: [-1] }\n'
        'ensemble_scheduling { step { tokenizer { file: "tokenizer.json" allow_empty: false } }\n'
        '  step { model_name: "enc" output_map { key: "embedding" value: "vec" } }\n'
        '  step { ann { index: "t.index" input: "vec" k: 4 } } }\n'
    )
    config = load_model_config(pipe)
    assert config is not None and config.ensemble_scheduling is not None
    steps = config.ensemble_scheduling.step
    assert steps[0].tokenizer is not None and steps[0].tokenizer.allow_empty is False
    assert steps[2].ann is not None and (steps[2].ann.k, steps[2].ann.max_k, steps[2].ann.input) == (
        4,
        100,
        "vec",
    )

    class Model:
        config = load_model_config(_encoder_dir(tmp_path))

    assert tensor_dim(config, 2, "vec", lambda name, version: Model) == 384
    assert tensor_dim(config, 2, "embedding", lambda name, version: Model) is None


def _encoder_dir(root: Path) -> Path:
    d = root / "enc"
    d.mkdir(exist_ok=True)
    (d / "config.pbtxt").write_text(
        'name: "enc"\nmax_batch_size: 8\ninput { name: "input_ids" data_type: TYPE_INT64 dims: [-1] }\n'
        'output { name: "embedding" data_type: TYPE_FP32 dims: [384] }\n'
    )
    return d


def test_read_texts_skips_empty_lines_and_keeps_the_first_of_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "texts.txt"
    path.write_text("first\n\n  second  \nfirst\n   \nthird\n", encoding="utf-8")
    texts = read_texts(path)
    assert texts.texts == ["first", "second", "third"]
    assert texts.ids.tolist() == [0, 2, 5]  # line numbers, so an id leads back to the file
    assert (texts.skipped_empty, texts.skipped_duplicates) == (2, 1)
    assert read_texts(path, limit=2).texts == ["first", "second"]
    csv_path = tmp_path / "t.csv"
    csv_path.write_text('id,text\n1,"a, quoted"\n2,\n3,b\n', encoding="utf-8")
    assert read_texts(csv_path, column="text").texts == ["a, quoted", "b"]
    with pytest.raises(ConfigError, match=r"no column 'body' \(columns: \['id', 'text'\]\)"):
        read_texts(csv_path, column="body")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ConfigError, match="no text to index"):
        read_texts(tmp_path / "empty.txt")


def test_a_sidecar_whose_dim_disagrees_with_the_index_file_is_refused_at_load(tmp_path: Path) -> None:
    # hnswlib trusts the dim it is given: a stale or edited .json used to load, then read
    # out of bounds on the first query (garbage scores, or a segfault for a large dim)
    x = np.random.default_rng(0).standard_normal((30, 16)).astype(np.float32)
    path = tmp_path / "v.index"
    AnnIndex.build(x, [f"t{i}" for i in range(30)]).save(path)
    meta_path = tmp_path / "v.index.json"
    for wrong in (2_000_000, 12):
        meta = json.loads(meta_path.read_text())
        meta["dim"] = wrong
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(ConfigError, match=f"holds vectors of dim 16, v.index.json says {wrong}"):
            AnnIndex.load(path)


def test_a_byte_order_mark_is_not_part_of_the_first_text_or_column(tmp_path: Path) -> None:
    txt = tmp_path / "t.txt"
    txt.write_bytes("\ufeffhello world\r\nother\r\nhello world\r\n".encode())
    got = read_texts(txt, None, None)
    assert got.texts == ["hello world", "other"] and got.skipped_duplicates == 1
    csv_file = tmp_path / "t.csv"
    csv_file.write_bytes("\ufeffid,text\r\n1,a\r\n".encode())
    assert read_texts(csv_file, "id", None).texts == ["1"]  # an Excel export's first column
