"""The browser edge on models unlike the example, and what an outside attack found: models
without a config or a backend, pipelines that rename their inputs, unbatched models, dynamic
dims beside fixed ones, a rebuild that must not destroy anything, hostile paths and
If-None-Match values, clients that vanish mid-download, and a model file that is not the
one the manifest names."""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from milliserve.testing import ServerProcess, wait_until

pytestmark = pytest.mark.e2e

pytest.importorskip("playwright.sync_api", reason="the [edge] extra (playwright) is needed")

PIPELINE = """\
name: fraud_rules
platform: ensemble
max_batch_size: 64
input: [{name: feats, data_type: TYPE_FP32, dims: [64]}]
output:
  - {name: decision, data_type: TYPE_STRING, dims: [1]}
  - {name: fraud_score, data_type: TYPE_FP32, dims: [1]}
ensemble_scheduling:
  step:
    - model_name: fraud_mlp
      input_map: {features: feats}
      output_map: {probabilities: probs}
    - rules:
        input: probs
        column: 1
        thresholds: [{at_least: 0.9, label: decline}, {at_least: 0.5, label: review}]
        default: approve
        output: decision
        score_output: fraud_score
"""


def _onnx(path: Path, shape: list[Any], scale: float) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [scale])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g", [x], [y], [k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _big(path: Path) -> None:
    """y = x + K with a 32 MiB K: a model file many download chunks long, and several times
    what the sockets between a server and a client that stopped reading can hold (the
    server's send buffer grows to 4 MiB here), so that a download abandoned on a busy
    machine, where the client is slow to go, still shows whether the reading stopped."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096, 2048])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096, 2048])
    k = helper.make_tensor(
        "k", TensorProto.FLOAT, [4096, 2048], np.ones(4096 * 2048, np.float32).tobytes(), raw=True
    )
    graph = helper.make_graph([helper.make_node("Add", ["x", "k"], ["y"])], "g", [x], [y], [k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def repo(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("unlike")
    shutil.copytree(example_repo / "fraud_mlp", repo / "fraud_mlp")
    (repo / "fraud_rules" / "1").mkdir(parents=True)
    (repo / "fraud_rules" / "config.yaml").write_text(PIPELINE)
    # no config at all: the server derives it from the model, so must the bundle
    (repo / "noconfig" / "1").mkdir(parents=True)
    shutil.copy(example_repo / "fraud_mlp" / "1" / "model.onnx", repo / "noconfig" / "1" / "model.onnx")
    _onnx(repo / "nobatch" / "1" / "model.onnx", [4], 2.0)
    (repo / "nobatch" / "config.yaml").write_text(
        "name: nobatch\nmax_batch_size: 0\ninput: [{name: x, data_type: TYPE_FP32, dims: [4]}]\n"
        "output: [{name: y, data_type: TYPE_FP32, dims: [4]}]\n"
    )
    _big(repo / "big" / "1" / "model.onnx")
    _onnx(repo / "dynseq" / "1" / "model.onnx", ["batch", "seq", 4], 3.0)
    (repo / "dynseq" / "config.yaml").write_text(
        "name: dynseq\nmax_batch_size: 8\ninput: [{name: x, data_type: TYPE_FP32, dims: [-1, 4]}]\n"
        "output: [{name: y, data_type: TYPE_FP32, dims: [-1, 4]}]\n"
    )
    return repo


@pytest.fixture(scope="module")
def served(
    repo: Path, tmp_path_factory: pytest.TempPathFactory, edge_build: Any
) -> Iterator[tuple[ServerProcess, Path]]:
    out = tmp_path_factory.mktemp("bundles")
    for name in ("fraud_rules", "noconfig", "nobatch", "dynseq", "big"):
        done = edge_build(repo / name, out)
        assert done.returncode == 0, (name, done.stderr)
    with ServerProcess(repo, "--edge", str(out)) as srv:
        yield srv, out


def _page(browser: Any, origin: str, bundle: str, route: Any = None) -> Any:
    from tests.support.browser import offline_page

    page, _ = offline_page(browser, origin)
    if route is not None:
        route(page)
    page.goto(f"{origin}/edge/{bundle}/?budget_ms=100000")
    page.wait_for_function(
        "window.milliserve && window.milliserve.client.state !== 'loading'", timeout=120_000
    )
    return page


def _both(page: Any, value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return page.evaluate(  # type: ignore[no-any-return]
        "async (v) => { const c = window.milliserve.client;"
        " return [await c.infer(v), await c.infer(v, {prefer: 'server'})]; }",
        value,
    )


@pytest.mark.parametrize(
    ("bundle", "value", "output"),
    [
        ("fraud_rules", {"feats": [0.5] * 64}, "fraud_score"),  # named as the pipeline names it
        ("fraud_rules", [0.5] * 64, "fraud_score"),
        ("noconfig", [0.25] * 64, "probabilities"),
        ("nobatch", [1.0, 2.0, 3.0, 4.0], "y"),  # max_batch_size 0: no batch dim in the page
        ("dynseq", [float(i) for i in range(12)], "y"),  # [-1, 4]: three rows of four
    ],
)
def test_models_unlike_the_example_answer_in_the_page_as_on_the_server(
    browser: Any, served: tuple[ServerProcess, Path], bundle: str, value: Any, output: str
) -> None:
    srv, _ = served
    page = _page(browser, f"http://{srv.http_url}", bundle)
    state = page.evaluate("[window.milliserve.client.state, window.milliserve.client.reason]")
    assert state[0] == "ready", state
    edge, server = _both(page, value)
    page.close()
    assert edge["source"] == "edge" and server["source"] == "server", (edge, server)
    np.testing.assert_allclose(edge["outputs"][output], server["outputs"][output], atol=1e-5)
    if bundle == "fraud_rules":
        assert edge["label"] == server["label"] and edge["label"] in ("approve", "review", "decline")


def test_a_model_file_unlike_its_manifest_is_not_run(
    browser: Any, served: tuple[ServerProcess, Path]
) -> None:
    """Same length, other bytes (a corrupted cache, a tampered copy): the SHA-256 check
    turns the edge off and the server answers."""
    srv, out = served
    real = next((out / "noconfig").glob("model.*.onnx")).read_bytes()
    bad = bytearray(real)
    bad[len(bad) // 2 : len(bad) // 2 + 64] = bytes(64)

    def tamper(page: Any) -> None:
        page.route("**/model.*.onnx", lambda r: r.fulfill(status=200, body=bytes(bad)))

    page = _page(browser, f"http://{srv.http_url}", "noconfig", tamper)
    state, reason = page.evaluate("[window.milliserve.client.state, window.milliserve.client.reason]")
    assert state == "off" and "SHA-256" in reason, reason
    edge, _ = _both(page, [0.25] * 64)
    page.close()
    assert edge["source"] == "server"


def test_a_rebuild_never_destroys_what_is_not_a_bundle(repo: Path, tmp_path: Path, edge_build: Any) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy)
    # --out inside the repository: refused, the model folder untouched
    done = edge_build(copy / "fraud_mlp", copy)
    assert done.returncode != 0 and "inside the model repository" in done.stderr
    assert (copy / "fraud_mlp" / "1" / "model.onnx").is_file()
    # a folder of the same name that is not a bundle: refused, untouched
    out = tmp_path / "out"
    (out / "fraud_mlp").mkdir(parents=True)
    (out / "fraud_mlp" / "notes.txt").write_text("mine")
    done = edge_build(copy / "fraud_mlp", out)
    assert done.returncode != 0 and "not an edge bundle" in done.stderr
    assert (out / "fraud_mlp" / "notes.txt").read_text() == "mine"
    # a failed rebuild leaves the earlier bundle as it was
    assert edge_build(copy / "fraud_mlp", out, "--name", "good").returncode == 0
    before = sorted(p.name for p in (out / "good").iterdir())
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    done = edge_build(copy / "fraud_mlp", out, "--name", "good", "--model-file", str(tmp_path / "junk.onnx"))
    assert done.returncode != 0 and "not an ONNX model" in done.stderr and "junk.onnx" in done.stderr
    assert sorted(p.name for p in (out / "good").iterdir()) == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget-ms", "nan"], "--budget-ms"),
        (["--budget-ms", "0"], "--budget-ms"),
        (["--threads", "-4"], "--threads"),
        (["--name", "../x"], "plain folder name"),
    ],
)
def test_bad_options_are_refused(
    repo: Path, tmp_path: Path, extra: list[str], message: str, edge_build: Any
) -> None:
    done = edge_build(repo / "fraud_mlp", tmp_path, *extra)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_another_models_file_is_refused_at_build(repo: Path, tmp_path: Path, edge_build: Any) -> None:
    done = edge_build(
        repo / "fraud_mlp", tmp_path, "--model-file", str(repo / "nobatch" / "1" / "model.onnx")
    )
    assert done.returncode != 0 and "this model's file" in done.stderr, done.stderr


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


def test_hostile_paths_and_conditional_requests(served: tuple[ServerProcess, Path], tmp_path: Path) -> None:
    srv, out = served
    origin = f"http://{srv.http_url}"
    assert httpx.get(f"{origin}/edge/{'a' * 300}/x").status_code == 404  # ENAMETOOLONG
    head = _raw(srv.http_port, b"GET /edge/foo%0d%0aSet-Cookie:%20x=1 HTTP/1.1\r\nhost: x\r\n\r\n")
    headers = head.split(b"\r\n\r\n", 1)[0].lower()
    assert headers.startswith(b"http/1.1 404") and b"set-cookie" not in headers
    moved = httpx.get(f"{origin}/edge/nobatch?edge=0")
    assert moved.status_code == 308 and moved.headers["location"] == "/edge/nobatch/?edge=0"
    first = httpx.get(f"{origin}/edge/nobatch/")
    etag = first.headers["etag"]
    for value, status in ((f"garbage{etag}garbage", 200), ("*", 304), (f'"x", W/{etag}', 304), (etag, 304)):
        r = httpx.get(f"{origin}/edge/nobatch/", headers={"if-none-match": value})
        assert r.status_code == status, value
    # a bundle folder that is a symlink out of the edge folder is not served
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out / "nobatch", elsewhere)
    (out / "linked").symlink_to(elsewhere)
    try:
        assert httpx.get(f"{origin}/edge/linked/manifest.json").status_code == 404
    finally:
        (out / "linked").unlink()


def _read_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def test_a_client_that_goes_away_stops_the_download(served: tuple[ServerProcess, Path]) -> None:
    srv, out = served
    assert srv.proc is not None
    model = next((out / "big").glob("model.*.onnx"))
    size = model.stat().st_size
    before = _read_bytes(srv.proc.pid)
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as s:
            s.sendall(f"GET /edge/big/{model.name} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            s.recv(1024)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    seen = [_read_bytes(srv.proc.pid)]

    def settled() -> bool:  # the server has stopped reading
        time.sleep(0.2)
        seen.append(_read_bytes(srv.proc.pid))  # type: ignore[union-attr]
        return seen[-1] == seen[-2]

    wait_until(settled, 60, "the server to stop reading", interval_s=0.0)
    read = seen[-1] - before
    assert read < 10 * size / 2, f"read {read} bytes for 10 abandoned downloads of {size}"
