"""The browser edge for real: ``milliserve edge build`` (npm + esbuild), ``milliserve serve
--edge``, and Debian's headless Chromium running the bundle with onnxruntime-web. The page's
answers are checked against the server's, then the edge path is taken away (model file
blocked, still downloading, too slow, input over its limits) and the server must answer.

WebGPU both ways: Chromium with ``--enable-unsafe-webgpu`` gives pages a WebGPU adapter (its
software one, SwiftShader, on a machine without a GPU), and the session must really run
there (ORT's device and its node placement log say so); without the flag the same bundle
runs on WASM and says why."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from milliserve.testing import ServerProcess, wait_until

# the module's bundles are built with npm and esbuild, each build given up to 900 s
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

playwright = pytest.importorskip("playwright.sync_api", reason="the [edge] extra (playwright) is needed")

SENTENCES = [
    "I love this!",
    "This is the worst day ever.",
    "meh",
    "Café crème brûlée at the naïve pâtisserie 😍🎉",
    "not bad, not great… could've been worse",
    "RT @someone: can't believe the game last night #sad",
    "",
    # over the pipeline's 64 tokens: both places truncate it the same way
    "great " * 40 + "but the ending ruined everything and I want my money back, terrible terrible",
    "日本語のテキストも大丈夫？",
    "   spaces   and\ttabs\nand newlines   ",
]
# docs/edge.md: labels equal; FP32 scores within 1e-5; INT8 (dynamic) scores within 1e-2 on
# average and 0.1 each: requantizing every layer turns 1e-7 float differences between the
# WASM and AVX-512 kernels into a different rounding now and then
FP32_TOLERANCE = 1e-5
INT8_MEAN_TOLERANCE = 1e-2
INT8_MAX_TOLERANCE = 0.1
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
# The example models carry a 50 ms budget (p99_ms), which is every request's deadline when it
# gives none: on a machine this busy (CPU burners, Chromium running the page's model) the
# server rightly refuses with 429 what its estimate says would miss it. These tests compare
# answers, not latency, so the test's own calls and the page's server calls (docs/edge.md,
# the client's `headers` option) give a deadline of their own, as a client that wants an
# answer does.
SERVER_DEADLINE = {"x-request-deadline-ms": "60000"}


@pytest.fixture(scope="module")
def bundles(example_repo: Path, tmp_path_factory: pytest.TempPathFactory, edge_build: Any) -> Path:
    out = tmp_path_factory.mktemp("edge")
    for target, extra in (
        ("sentiment", ()),
        ("fraud_mlp", ()),
        ("sentiment", ("--webgpu", "--name", "sentiment_webgpu")),
        ("fraud_mlp", ("--webgpu", "--fp16", "--name", "fraud_mlp_webgpu")),
        ("fraud_mlp", ("--webgpu", "asyncify", "--name", "fraud_mlp_asyncify")),
    ):
        done = edge_build(example_repo / target, out, *extra)
        assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def webgpu_browser() -> Iterator[Any]:
    """Chromium whose pages get a WebGPU adapter (SwiftShader where there is no GPU)."""
    from tests.support.browser import chromium

    with chromium(webgpu=True) as context:
        yield context


@pytest.fixture(scope="module")
def edge_server(example_repo: Path, bundles: Path) -> Iterator[ServerProcess]:
    with ServerProcess(example_repo, "--edge", str(bundles)) as proc:
        yield proc


@pytest.fixture
def origin(edge_server: ServerProcess) -> str:
    return f"http://{edge_server.http_url}"


def _open(
    browser: Any, origin: str, query: str = "", model: str = "sentiment", before: Any = None
) -> tuple[Any, list[str]]:
    from tests.support.browser import offline_page

    page, refused = offline_page(browser, origin)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text))
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url))
    if before is not None:
        before(page)
    page.goto(f"{origin}/edge/{model}/{query}")
    page.wait_for_function("window.milliserve !== undefined", timeout=60_000)
    page.evaluate("h => { window.milliserve.client.options.headers = h; }", SERVER_DEADLINE)
    page.errors = errors  # type: ignore[attr-defined]
    page.console = console  # type: ignore[attr-defined]
    page.fetched = fetched  # type: ignore[attr-defined]
    return page, refused


def _settled(page: Any) -> tuple[str, str]:
    page.wait_for_function("window.milliserve.client.state !== 'loading'", timeout=120_000)
    return page.evaluate("[window.milliserve.client.state, window.milliserve.client.reason]")  # type: ignore[no-any-return]


def _infer(page: Any, value: Any, prefer: str | None = None) -> dict[str, Any]:
    return page.evaluate(  # type: ignore[no-any-return]
        "async ([v, prefer]) => { const a = await window.milliserve.client.infer(v, prefer ? {prefer} : {});"
        " window.milliserve.show(a); return a; }",
        [value, prefer],
    )


def _server_answer(origin: str, text: str, model: str = "sentiment") -> tuple[str, float]:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    r = httpx.post(f"{origin}/v2/models/{model}/infer", json=body, headers=SERVER_DEADLINE, timeout=30)
    r.raise_for_status()
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    return out["label"][0], out["score"][0]


def _compare(page: Any, origin: str, model: str = "sentiment") -> list[float]:
    """Every sentence through the page's model and the server: the labels must agree; the
    score differences are returned."""
    diffs = []
    for text in SENTENCES:
        edge = _infer(page, text)
        assert edge["source"] == "edge", edge
        assert edge["ms"] > 0 and edge["reason"] is None
        label, score = _server_answer(origin, text, model)
        assert edge["label"] == label, (text, edge, label, score)
        diffs.append(abs(edge["score"] - score))
        via_page = _infer(page, text, prefer="server")
        assert via_page["source"] == "server" and via_page["label"] == label
    return diffs


def test_the_page_answers_in_the_browser_as_the_server_does(
    browser: Any, origin: str, example_repo: Path
) -> None:
    from milliserve.edge.bundle import model_precision

    page, refused = _open(browser, origin, "?budget_ms=100000")
    state, reason = _settled(page)
    assert state == "ready", reason
    assert page.evaluate("crossOriginIsolated") is True
    # the bundle carries the variant optimize shipped: INT8 (dynamic) where it measured faster
    # than FP32 beyond the spread of its rounds, FP32 where it could not tell (a busy machine)
    shipped = model_precision(example_repo / "sentiment_model" / "1" / "model.onnx")
    assert shipped in ("int8 (dynamic)", "fp32")
    assert page.evaluate("window.milliserve.client.manifest.model.precision") == shipped
    diffs = _compare(page, origin)
    if shipped == "fp32":
        assert max(diffs) <= FP32_TOLERANCE, diffs
    else:
        assert max(diffs) <= INT8_MAX_TOLERANCE and sum(diffs) / len(diffs) <= INT8_MEAN_TOLERANCE, diffs
    # and as a person would: type, press the button, read the answer off the page
    shown = page.evaluate("window.milliserve.answers.length")
    page.fill("#text", "What a lovely surprise, thank you all!")
    page.click("button[type=submit]")
    page.wait_for_function(f"window.milliserve.answers.length > {shown}")
    assert page.inner_text("#source") == "edge" and page.inner_text("#via") == "on wasm"
    assert page.inner_text("#label") == _server_answer(origin, "What a lovely surprise, thank you all!")[0]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "edge-demo.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert not refused, refused  # nothing outside the page's origin was asked for
    assert not page.errors
    page.close()


def test_an_fp32_model_answers_exactly_as_the_server(
    browser: Any, example_repo: Path, tmp_path: Path, edge_build: Any
) -> None:
    """The FP32 classifier the example's optimize starts from, served and bundled: the same
    scores to 1e-5 in the page as on the server."""
    from milliserve.examples.sentiment_pipeline import fp32_classifier

    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "sentiment", repo / "sentiment")
    shutil.copytree(example_repo / "sentiment_model", repo / "sentiment_model")
    shutil.copy(fp32_classifier(), repo / "sentiment_model" / "1" / "model.onnx")
    # this test is about parity: the FP32 model needs about 50 ms a call on a loaded machine,
    # so the pipeline's 50 ms budget (a 429 for the page's server calls) is taken out
    config = repo / "sentiment" / "config.yaml"
    config.write_text(re.sub(r"^budget:\n(?:  .*\n)+", "", config.read_text(), flags=re.M))
    assert "p99_ms" not in config.read_text()
    done = edge_build(repo / "sentiment", tmp_path / "edge", "--name", "sentiment_fp32")
    assert done.returncode == 0, done.stderr
    with ServerProcess(repo, "--edge", str(tmp_path / "edge")) as proc:
        origin = f"http://{proc.http_url}"
        page, _ = _open(browser, origin, "?budget_ms=100000", model="sentiment_fp32")
        state, reason = _settled(page)
        assert state == "ready", reason
        assert page.evaluate("window.milliserve.client.manifest.model.precision") == "fp32"
        diffs = _compare(page, origin)
        page.close()
    assert max(diffs) <= FP32_TOLERANCE, diffs


def test_the_page_tokenizes_as_the_server_does(browser: Any, origin: str, example_repo: Path) -> None:
    """tokenizers.js in the page against Rust tokenizers, with the pipeline's truncation."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(example_repo / "sentiment" / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(64)
    page, _ = _open(browser, origin, "?budget_ms=100000")
    _settled(page)
    for text in SENTENCES:
        ids = page.evaluate("(t) => window.milliserve.client.encoder.encode(t).ids", text)
        assert ids == tok.encode(text).ids, text
    page.close()


def test_wasm_threads_run_when_the_page_is_isolated(browser: Any, origin: str) -> None:
    page, _ = _open(browser, origin, "?budget_ms=100000&threads=2")
    state, reason = _settled(page)
    assert state == "ready", reason
    assert page.evaluate("window.milliserve.client.threads") == 2
    wait_until(lambda: len(page.workers) >= 1, 30, "ORT's worker thread (threads - 1)")
    assert _infer(page, "threads work")["source"] == "edge"
    page.close()


def test_a_blocked_model_file_falls_back_to_the_server(browser: Any, origin: str) -> None:
    page, _ = _open(
        browser, origin, "?budget_ms=100000", before=lambda p: p.route("**/model.*.onnx", lambda r: r.abort())
    )
    state, reason = _settled(page)
    assert state == "off" and "edge unavailable" in reason, reason
    for text in SENTENCES[:4]:
        answer = _infer(page, text)
        assert answer["source"] == "server" and "edge unavailable" in answer["reason"]
        assert answer["label"] == _server_answer(origin, text)[0]
    assert page.inner_text("#source") == "server"
    page.close()


def test_the_server_answers_while_the_model_downloads(browser: Any, origin: str) -> None:
    held: list[Any] = []

    def hold(page: Any) -> None:
        page.route("**/model.*.onnx", lambda r: held.append(r))

    page, _ = _open(browser, origin, "?budget_ms=100000", before=hold)
    wait_until(lambda: held, 30, "the model request")
    answer = _infer(page, "is it loaded yet?")
    assert answer["source"] == "server" and answer["reason"] == "model still loading", answer
    held[0].fallback()
    state, reason = _settled(page)
    assert state == "ready", reason
    assert _infer(page, "is it loaded yet?")["source"] == "edge"
    page.close()


def test_a_slow_device_hands_its_work_to_the_server(browser: Any, origin: str) -> None:
    page, _ = _open(browser, origin, "?budget_ms=0.001")
    state, reason = _settled(page)
    assert state == "off" and reason.startswith("too slow on this device"), reason
    answer = _infer(page, "slow device")
    assert answer["source"] == "server" and answer["reason"].startswith("too slow")
    page.close()


def test_input_over_the_edge_limits_goes_to_the_server(browser: Any, origin: str) -> None:
    page, _ = _open(browser, origin, "?budget_ms=100000")
    assert _settled(page)[0] == "ready"
    text = "long " * 1000  # 5000 bytes: over the tokenizer's 4096-byte text limit
    answer = _infer(page, text)
    assert answer["source"] == "server" and "over the edge model's limits" in answer["reason"], answer
    assert answer["label"] == _server_answer(origin, text)[0]
    page.close()


def test_a_tensor_model_runs_in_the_page_too(browser: Any, origin: str) -> None:
    """fraud_mlp: FP32 features in, probabilities out; no tokenizer, no rules."""
    page, _ = _open(browser, origin, "?budget_ms=100000", model="fraud_mlp")
    state, reason = _settled(page)
    assert state == "ready", reason
    rng = np.random.default_rng(3)
    for _ in range(5):
        x = rng.normal(size=64).astype(np.float32)
        edge = _infer(page, x.tolist())
        server = _infer(page, x.tolist(), prefer="server")
        assert edge["source"] == "edge" and server["source"] == "server"
        np.testing.assert_allclose(
            edge["outputs"]["probabilities"], server["outputs"]["probabilities"], atol=FP32_TOLERANCE
        )
    with pytest.raises(playwright.Error, match="HTTP 400"):  # 2 values for a [64] input
        _infer(page, [1.0, 2.0])
    page.close()


def test_edge_files_carry_isolation_and_cache_headers(origin: str, bundles: Path) -> None:
    manifest = httpx.get(f"{origin}/edge/sentiment/manifest.json").json()
    page = httpx.get(f"{origin}/edge/sentiment/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["cross-origin-opener-policy"] == "same-origin"
    assert page.headers["cross-origin-embedder-policy"] == "require-corp"
    assert page.headers["cache-control"] == "no-cache"
    again = httpx.get(f"{origin}/edge/sentiment/", headers={"if-none-match": page.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    model = httpx.head(f"{origin}/edge/sentiment/{manifest['model']['file']}")
    assert model.status_code == 200 and "immutable" in model.headers["cache-control"]
    assert int(model.headers["content-length"]) == manifest["model"]["bytes"]
    wasm_dir = manifest["edge"]["wasm_path"]
    wasm = httpx.head(f"{origin}/edge/sentiment/{wasm_dir}ort-wasm-simd-threaded.wasm")
    assert wasm.headers["content-type"] == "application/wasm" and "immutable" in wasm.headers["cache-control"]
    mjs = httpx.head(f"{origin}/edge/sentiment/{wasm_dir}ort-wasm-simd-threaded.mjs")
    assert mjs.headers["content-type"].startswith("text/javascript")
    listed = ["fraud_mlp", "fraud_mlp_asyncify", "fraud_mlp_webgpu", "sentiment", "sentiment_webgpu"]
    assert httpx.get(f"{origin}/edge/").json() == {"bundles": listed}
    moved = httpx.get(f"{origin}/edge/sentiment")
    assert moved.status_code == 308 and moved.headers["location"] == "/edge/sentiment/"
    assert httpx.post(f"{origin}/edge/sentiment/manifest.json").status_code == 405


def test_edge_files_stay_inside_their_bundle(origin: str, bundles: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the web")
    (bundles / "sentiment" / "leak.txt").symlink_to(secret)
    (bundles / "sentiment" / ".hidden").write_text("dotfile")
    try:
        for path in (
            "/edge/sentiment/leak.txt",
            "/edge/sentiment/.hidden",
            "/edge/sentiment/%2e%2e/fraud_mlp/manifest.json",
            "/edge/sentiment/..%2f..%2f..%2fetc%2fpasswd",
            "/edge/nope/index.html",
            "/edge/sentiment/missing.js",
        ):
            r = httpx.get(f"{origin}{path}")
            assert r.status_code == 404, (path, r.status_code)
            assert "not for the web" not in r.text
    finally:
        (bundles / "sentiment" / "leak.txt").unlink()
        (bundles / "sentiment" / ".hidden").unlink()


def test_edge_is_off_unless_turned_on(server: ServerProcess) -> None:
    r = httpx.get(f"http://{server.http_url}/edge/sentiment/")
    assert r.status_code == 404 and "--edge" in r.json()["error"]


def test_models_the_browser_cannot_run_are_refused_with_the_reason(
    example_repo: Path, tmp_path: Path, edge_build: Any
) -> None:
    done = edge_build(example_repo / "fraud", tmp_path)  # looks up features in a store
    assert done.returncode != 0
    assert "cannot run in the browser" in done.stderr or "needs the server" in done.stderr, done.stderr
    done = edge_build(example_repo / "no_such_model", tmp_path)
    assert done.returncode != 0 and "no model 'no_such_model'" in done.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)


# WebGPU on a software adapter is slow (a MiniLM run takes about 0.5 s on SwiftShader, and
# each new sequence length compiles shaders): a short warm-up
FORCED_WEBGPU = "?budget_ms=100000&provider=webgpu&warmup_runs=3&ort_log=1"


def _client(page: Any) -> dict[str, Any]:
    return page.evaluate(  # type: ignore[no-any-return]
        "(() => { const c = window.milliserve.client;"
        " return {state: c.state, reason: c.reason, provider: c.provider, providers: c.providers}; })()"
    )


def _placed(page: Any) -> list[str]:
    """ORT's node placement log lines (the page asked for them with ort_log=1)."""
    return [m for m in page.console if "placed on [" in m]


def _positive(label: str, score: float) -> float:
    return score if label == "positive" else 1.0 - score


def test_webgpu_runs_the_sentiment_pipeline_as_the_server_does(webgpu_browser: Any, origin: str) -> None:
    page, refused = _open(webgpu_browser, origin, FORCED_WEBGPU, model="sentiment_webgpu")
    state, reason = _settled(page)
    assert state == "ready", reason
    client = _client(page)
    assert client["provider"] == "webgpu" and "on webgpu" in reason, client
    # ORT created its session on a GPU device (SwiftShader here), and placed nodes on it; the
    # dynamic-INT8 kernels it has no WebGPU code for run on the CPU, in the same session
    (measured,) = client["providers"]["measured"]
    assert measured["provider"] == "webgpu" and measured["adapter"], measured
    assert measured["adapter"] == client["providers"]["adapter"]["name"]
    placed = _placed(page)
    assert any("[WebGpuExecutionProvider]" in m for m in placed), placed
    assert any("[CPUExecutionProvider]" in m for m in placed), placed
    diffs = []
    for text in SENTENCES:
        edge = _infer(page, text)
        assert edge["source"] == "edge" and edge["provider"] == "webgpu", edge
        label, score = _server_answer(origin, text)
        diffs.append(abs(_positive(edge["label"], edge["score"]) - _positive(label, score)))
        # INT8's requantization carries 1e-7 kernel differences on: a label may differ only
        # where the server's score is that close to 0.5 (docs/edge.md)
        assert edge["label"] == label or abs(score - 0.5) <= INT8_MAX_TOLERANCE, (text, edge, label, score)
    assert max(diffs) <= INT8_MAX_TOLERANCE and sum(diffs) / len(diffs) <= INT8_MEAN_TOLERANCE, diffs
    # the demo page says which provider answered
    assert page.inner_text("#provider") == "webgpu"
    assert page.inner_text("#source") == "edge" and page.inner_text("#via") == "on webgpu"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "edge-demo-webgpu.png"), full_page=True)
    # one runtime: the WebGPU flavour (it runs WASM too); the plain WASM one is never fetched
    assert any(u.endswith("ort-wasm-simd-threaded.jspi.wasm") for u in page.fetched), page.fetched
    assert not any(u.endswith("ort-wasm-simd-threaded.wasm") for u in page.fetched)
    assert not refused and not page.errors, (refused, page.errors)
    page.close()


@pytest.mark.parametrize("bundle", ["fraud_mlp_webgpu", "fraud_mlp_asyncify"])
def test_webgpu_runs_a_tensor_model_as_the_server_does(webgpu_browser: Any, origin: str, bundle: str) -> None:
    """A model without a tokenizer, FP32: the server's outputs to 1e-5, with each flavour."""
    page, _ = _open(webgpu_browser, origin, FORCED_WEBGPU, model=bundle)
    state, reason = _settled(page)
    assert state == "ready", reason
    assert _client(page)["provider"] == "webgpu"
    assert any("[WebGpuExecutionProvider]" in m for m in _placed(page)), page.console
    rng = np.random.default_rng(5)
    for _ in range(4):
        x = rng.normal(size=64).astype(np.float32)
        edge = _infer(page, x.tolist())
        server = _infer(page, x.tolist(), prefer="server")
        assert edge["provider"] == "webgpu" and server["source"] == "server" and server["provider"] is None
        np.testing.assert_allclose(
            edge["outputs"]["probabilities"], server["outputs"]["probabilities"], atol=FP32_TOLERANCE
        )
    assert not page.errors, page.errors
    page.close()


def test_auto_times_both_providers_and_keeps_the_faster(webgpu_browser: Any, origin: str) -> None:
    page, _ = _open(webgpu_browser, origin, "?budget_ms=100000", model="fraud_mlp_webgpu")
    state, reason = _settled(page)
    assert state == "ready", reason
    client = _client(page)
    report = client["providers"]
    measured = {r["provider"]: r for r in report["measured"] if r["precision"] == "fp32"}
    assert set(measured) == {"wasm", "webgpu"} and not any("error" in r for r in measured.values()), report
    # the choice follows the page's own measurement (no claim here about which is faster)
    faster = min(measured.values(), key=lambda r: (bool(r.get("stopped")), r["p50"]))
    assert client["provider"] == faster["provider"] == report["chosen"], report
    assert "wasm p50" in reason or "webgpu p50" in reason, reason
    assert _infer(page, [0.5] * 64)["provider"] == faster["provider"]
    # the FP16 copy is for adapters with shader-f16 only; where it is not used, it is not fetched
    if not report["adapter"]["f16"]:
        assert any(s.get("precision") == "fp16" and "shader-f16" in s["why"] for s in report["skipped"])
        assert not any("model_half." in u for u in page.fetched), page.fetched
    page.close()


def test_a_webgpu_runtime_that_fails_to_load_leaves_wasm_and_says_why(
    webgpu_browser: Any, origin: str
) -> None:
    def block(page: Any) -> None:
        page.route("**/*.jspi.wasm", lambda r: r.abort())

    page, _ = _open(webgpu_browser, origin, "?budget_ms=100000", model="fraud_mlp_webgpu", before=block)
    state, reason = _settled(page)
    # both providers failed on the WebGPU runtime, and WASM ran on the plain one, saying so
    assert state == "ready" and "on wasm" in reason, reason
    assert "wasm (jspi runtime) failed" in reason and "webgpu failed" in reason, reason
    assert _infer(page, [0.5] * 64)["provider"] == "wasm"
    assert any(u.endswith("ort-wasm-simd-threaded.wasm") for u in page.fetched)
    page.close()


def test_without_webgpu_the_same_bundle_runs_on_wasm_and_says_why(browser: Any, origin: str) -> None:
    page, refused = _open(browser, origin, "?budget_ms=100000", model="sentiment_webgpu")
    state, reason = _settled(page)
    assert state == "ready", reason
    client = _client(page)
    assert client["provider"] == "wasm" and "webgpu not tried: this browser gives no WebGPU adapter" in reason
    diffs = _compare(page, origin)
    assert max(diffs) <= INT8_MAX_TOLERANCE and sum(diffs) / len(diffs) <= INT8_MEAN_TOLERANCE, diffs
    assert _infer(page, "hello")["provider"] == "wasm"
    # nothing of the WebGPU runtime was downloaded
    assert not any("jspi" in u or "asyncify" in u for u in page.fetched), page.fetched
    assert not refused
    page.close()
    # a page that insists on WebGPU gets the server, and the reason, never a quiet WASM
    page, _ = _open(browser, origin, "?budget_ms=100000&provider=webgpu", model="sentiment_webgpu")
    state, reason = _settled(page)
    assert state == "off" and "webgpu was asked for" in reason, reason
    answer = _infer(page, "I love this!")
    assert (
        answer["source"] == "server"
        and answer["provider"] is None
        and "webgpu was asked for" in answer["reason"]
    )
    page.close()


def test_webgpu_bundles_ship_one_flavour_and_check_their_options(bundles: Path, example_repo: Path) -> None:
    from milliserve.edge.bundle import build_bundle
    from milliserve.errors import ConfigError

    def ort_files(name: str) -> set[str]:
        manifest = json.loads((bundles / name / "manifest.json").read_text())
        return {f.name for f in (bundles / name / manifest["edge"]["wasm_path"]).iterdir()}

    plain = {"ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs"}
    assert ort_files("sentiment") == plain
    assert ort_files("sentiment_webgpu") == plain | {
        "ort.jspi.min.mjs",
        "ort-wasm-simd-threaded.jspi.mjs",
        "ort-wasm-simd-threaded.jspi.wasm",
    }
    assert "ort.webgpu.min.mjs" in ort_files("fraud_mlp_asyncify")
    half = json.loads((bundles / "fraud_mlp_webgpu" / "manifest.json").read_text())["edge"]["webgpu"][
        "half_model"
    ]
    assert (bundles / "fraud_mlp_webgpu" / half["file"]).stat().st_size == half["bytes"]
    assert half["precision"] == "fp16" and half["max_abs_diff"] < 1e-2
    out = example_repo.parent / "edge-refused"
    with pytest.raises(ConfigError, match="add --webgpu"):
        build_bundle(example_repo / "fraud_mlp", out, provider="webgpu")
    with pytest.raises(ConfigError, match="add --webgpu"):
        build_bundle(example_repo / "fraud_mlp", out, fp16=True)
    # an INT8 model is refused --fp16: made here, as the example's shipped variant depends on
    # what optimize measured on this machine
    from onnxruntime.quantization import quantize_dynamic

    int8 = example_repo.parent / "edge-int8" / "fraud_mlp"
    (int8 / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(example_repo / "fraud_mlp" / "config.pbtxt", int8 / "config.pbtxt")
    quantize_dynamic(str(example_repo / "fraud_mlp" / "1" / "model.onnx"), str(int8 / "1" / "model.onnx"))
    with pytest.raises(ConfigError, match=r"--fp16 converts an FP32 model .* is int8 \(dynamic\)"):
        build_bundle(int8, out, webgpu="jspi", fp16=True)
    assert not (out / "fraud_mlp").exists()
