"""The browser edge: what the bundle weighs, how long a page takes to its first answer, and
per-request latency in the page (WASM, 1 and 2 threads; WebGPU) against the server's round
trip from the same page.

    python benchmarks/edge.py [--requests 200] [--rounds 3] [--parity 1000]
                              [--webgpu-requests 30] [--webgpu-parity 100] [--no-webgpu]
    python benchmarks/edge.py --quick      # a few minutes, to check the script; prints, writes nothing

One server (``milliserve serve --edge``) serves the example sentiment pipeline twice: as
built (``sentiment``, the INT8 model optimize shipped) and with the FP32 classifier optimize
started from (``sentiment_fp32``); ``milliserve edge build --webgpu`` bundles both, with
onnxruntime-web's WebGPU runtime beside the WASM one. Debian's headless Chromium loads the
pages from that server on loopback, so "download" here is the server reading files, not a
network: a real page adds the model's transfer time. WASM pages run in a Chromium without
WebGPU; WebGPU pages in one with ``--enable-unsafe-webgpu``, whose adapter the report names
(on a machine without a GPU it is SwiftShader, Chromium's software rasterizer: a CPU
emulating a GPU, not a GPU's speed).

- **Bundle**: bytes per part (model, ORT's WASM and WebGPU runtimes, JS, tokenizer, page),
  and what a page downloads without and with a WebGPU adapter.
- **First answer** (cold): a fresh browser profile per round (empty cache), navigation start
  to the first answer computed in the page; split into manifest, model download, session
  creation and warm-up (8 runs per provider). WASM at 1 and 2 threads; with a WebGPU
  adapter, WebGPU alone and ``auto`` (both timed, the faster kept: what a visitor gets).
- **Per request**: ``client.infer(text)`` timed in the page (tokenize, run, label), over
  held-out tweets one at a time; variants interleaved round by round (rotating the order),
  each round's p50/p99, medians of the rounds. The server variant is the same page calling
  the server's OIP endpoint (``prefer: "server"``): JSON, HTTP on loopback, server batching.
- **Parity**: each held-out tweet through the page's model and through the server (batch 1):
  label agreement and score differences, INT8 and FP32, on WASM and on WebGPU.
- **Integer kernels**: DynamicQuantizeLinear + MatMulInteger (what dynamic INT8 is made of)
  on random inputs, in the page (each provider) against ONNX Runtime in Python, compared
  bit for bit; the report says what the comparison found.

The browser, the server and this script share the machine's CPUs. Writes the "edge" section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from report_sections import commit, write_section
from server_overhead import cpu_description

from milliserve.edge.bundle import build_bundle
from milliserve.examples.build import build_examples
from milliserve.examples.sentiment import LABELS, splits
from milliserve.examples.sentiment_pipeline import N_EVAL, N_TRAIN, fp32_classifier
from milliserve.percentiles import percentile, percentiles
from milliserve.testing import ServerProcess

# the browser the edge tests load pages in: tests/support, not installed with the package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.browser import chromium, offline_page

ROOMY = "budget_ms=1000000"  # the policy is not measured here: the page always answers itself
# a WebGPU page for the per-request rows: 3 warm-up runs (on a software adapter each MiniLM
# run takes 0.5-3 s, and the warm-up is not what these rows measure)
FORCED_GPU = f"{ROOMY}&provider=webgpu&warmup_runs=3"
BUNDLES = ("sentiment", "sentiment_fp32")
STORED: dict[str, dict[str, Any]] = {}  # what measure() measured, for the results store


@dataclass(frozen=True)
class Variant:
    name: str
    bundle: str
    threads: int
    prefer: str | None  # "server": the page calls the server
    gpu: bool  # a WebGPU page (forced), in the Chromium with an adapter


def build_repo(work: Path) -> tuple[Path, Path]:
    """The example sentiment pipeline as built and with the FP32 model; both bundles."""
    repo, edge = work / "repo", work / "edge"
    build_examples(repo, only=["sentiment"])
    shutil.copytree(repo / "sentiment_model", repo / "sentiment_model_fp32")
    shutil.copy(fp32_classifier(), repo / "sentiment_model_fp32" / "1" / "model.onnx")
    cfg = (repo / "sentiment_model_fp32" / "config.yaml").read_text()
    (repo / "sentiment_model_fp32" / "config.yaml").write_text(
        re.sub(r"^name: \S+$", "name: sentiment_model_fp32", cfg, count=1, flags=re.M)
    )
    shutil.copytree(repo / "sentiment", repo / "sentiment_fp32")
    cfg = (repo / "sentiment_fp32" / "config.yaml").read_text()
    cfg = re.sub(r"^name: \S+$", "name: sentiment_fp32", cfg, count=1, flags=re.M)
    (repo / "sentiment_fp32" / "config.yaml").write_text(
        cfg.replace("model_name: sentiment_model\n", "model_name: sentiment_model_fp32\n")
    )
    for name in BUNDLES:
        build_bundle(repo / name, edge, webgpu="jspi")
    return repo, edge


def sizes(bundle: Path) -> dict[str, int]:
    parts = {
        "model": 0,
        "ORT WASM runtime": 0,
        "ORT WebGPU runtime": 0,
        "JavaScript": 0,
        "tokenizer": 0,
        "page, manifest": 0,
    }
    for f in bundle.rglob("*"):
        if not f.is_file():
            continue
        n = f.stat().st_size
        if f.suffix == ".onnx":
            parts["model"] += n
        elif f.parent.name.startswith("ort-"):
            gpu = ".jspi." in f.name or ".asyncify." in f.name or f.name == "ort.webgpu.min.mjs"
            parts["ORT WebGPU runtime" if gpu else "ORT WASM runtime"] += n
        elif f.name.startswith("tokenizer."):
            parts["tokenizer"] += n
        elif f.suffix == ".js":
            parts["JavaScript"] += n
        else:
            parts["page, manifest"] += n
    return parts


SETTLED = "window.milliserve && window.milliserve.client.state !== 'loading'"
REPORT = """(() => { const c = window.milliserve.client;
    return { provider: c.provider, adapter: c.providers && c.providers.adapter,
             measured: c.providers && c.providers.measured }; })()"""


def open_page(context: Any, origin: str, bundle: str, query: str) -> Any:
    page, refused = offline_page(context, origin)
    page.goto(f"{origin}/edge/{bundle}/?{query}")
    page.wait_for_function(SETTLED, timeout=600_000)
    state = page.evaluate("[window.milliserve.client.state, window.milliserve.client.reason]")
    assert state[0] == "ready", state
    assert not refused, refused
    return page


def cold_start(origin: str, bundle: str, query: str, webgpu: bool) -> dict[str, Any]:
    """A fresh profile (nothing cached): navigation start to the first answer, in the page."""
    with chromium(webgpu=webgpu) as context:
        page = open_page(context, origin, bundle, f"{ROOMY}&{query}")
        out: dict[str, Any] = page.evaluate(
            """async () => {
                const c = window.milliserve.client;
                const a = await c.infer("first answer, please");
                return { ...c.timings, first_answer_ms: performance.now(), infer_ms: a.ms,
                         provider: a.provider };
            }"""
        )
    return out


RUN = """async ([texts, prefer, provider]) => {
    const c = window.milliserve.client, ms = [];
    for (const t of texts) {
        const a = await c.infer(t, prefer ? { prefer } : {});
        if (a.source !== (prefer || "edge")) throw new Error(`answered by ${a.source}: ${a.reason}`);
        if (!prefer && a.provider !== provider) throw new Error(`answered on ${a.provider}, not ${provider}`);
        ms.push(a.ms);
    }
    return ms;
}"""


def parity(page: Any, origin: str, server_model: str, rows: list[tuple[str, int]]) -> dict[str, float]:
    edge = page.evaluate(
        "async (texts) => { const out = []; for (const t of texts) {"
        " const a = await window.milliserve.client.infer(t); out.push([a.label, a.score, a.source]); }"
        " return out; }",
        [t for t, _ in rows],
    )
    diffs, agree, right_edge, right_server = [], 0, 0, 0
    with httpx.Client(timeout=60) as c:
        for (text, y), (label, score, source) in zip(rows, edge, strict=True):
            assert source == "edge"
            body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
            r = c.post(f"{origin}/v2/models/{server_model}/infer", json=body)
            r.raise_for_status()
            out = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
            agree += out["label"] == label
            # the positive class's probability in both places (a label may differ near 0.5)
            ours = score if label == "positive" else 1 - score
            theirs = out["score"] if out["label"] == "positive" else 1 - out["score"]
            diffs.append(abs(ours - theirs))
            right_edge += label == LABELS[y]
            right_server += out["label"] == LABELS[y]
    d = np.array(diffs)
    n = len(rows)
    return {
        "n": n,
        "agree": agree / n,
        "mean": float(d.mean()),
        "p99": percentile(d, 99),
        "max": float(d.max()),
        "within_1e-2": float((d <= 1e-2).mean()),
        "acc_edge": right_edge / n,
        "acc_server": right_server / n,
    }


KERNEL_SHAPE = [1, 32, 384]  # a MiniLM layer's activations for a 32-token text


def integer_kernels_model() -> bytes:
    """DynamicQuantizeLinear → MatMulInteger with fixed uint8 weights, every output exposed."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.integers(0, 256, size=(384, 384)).astype(np.uint8), "W")
    wz = numpy_helper.from_array(np.array(128, np.uint8), "WZ")
    graph = helper.make_graph(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "scale", "zero"]),
            helper.make_node("MatMulInteger", ["xq", "W", "zero", "WZ"], ["acc"]),
        ],
        "integer_kernels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, KERNEL_SHAPE)],
        [
            helper.make_tensor_value_info("xq", TensorProto.UINT8, KERNEL_SHAPE),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("zero", TensorProto.UINT8, []),
            helper.make_tensor_value_info("acc", TensorProto.INT32, [*KERNEL_SHAPE[:2], 384]),
        ],
        [w, wz],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()  # type: ignore[no-any-return]


KERNELS_IN_PAGE = """async ([bytes, provider, inputs, shape]) => {
    const ort = window.milliserve.client.ort;
    const s = await ort.InferenceSession.create(new Uint8Array(bytes),
        { executionProviders: [provider], logSeverityLevel: 0 });
    const out = [];
    for (const x of inputs) {
        const r = await s.run({ x: new ort.Tensor("float32", Float32Array.from(x), shape) });
        out.push(Object.fromEntries(Object.entries(r).map(([k, v]) => [k, Array.from(v.data)])));
    }
    await s.release();
    return out;
}"""


def integer_kernels(page: Any, provider: str, trials: int) -> dict[str, Any]:
    """The integer kernels in the page (on ``provider``) against ONNX Runtime here, bit for
    bit: how many of ``trials`` random inputs gave identical outputs, and where ORT placed
    the nodes (its log)."""
    import onnxruntime as ort

    model = integer_kernels_model()
    rng = np.random.default_rng(11)
    inputs = [(rng.normal(size=KERNEL_SHAPE) * rng.uniform(0.1, 4)).astype(np.float32) for _ in range(trials)]
    placed: list[str] = []

    def on_console(msg: Any) -> None:
        if "placed on [" in msg.text:
            placed.append(
                re.sub(r".*placed on \[(\w+)\]\. Number of nodes: (\d+).*", r"\2 nodes on \1", msg.text)
            )

    page.on("console", on_console)
    got = page.evaluate(
        KERNELS_IN_PAGE, [list(model), provider, [x.ravel().tolist() for x in inputs], KERNEL_SHAPE]
    )
    page.remove_listener("console", on_console)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    exact, worst = 0, 0.0
    for x, page_out in zip(inputs, got, strict=True):
        ours = dict(zip(names, session.run(None, {"x": x}), strict=True))
        same = True
        for name, ref in ours.items():
            theirs = np.asarray(page_out[name], dtype=ref.dtype).reshape(ref.shape)
            if not np.array_equal(np.atleast_1d(theirs).view(np.uint8), np.atleast_1d(ref).view(np.uint8)):
                same = False
                worst = max(worst, float(np.max(np.abs(theirs.astype(np.float64) - ref.astype(np.float64)))))
        exact += same
    return {"provider": provider, "trials": trials, "exact": exact, "max_diff": worst, "placed": placed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200, help="tweets per WASM/server variant per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", type=int, default=3, help="cold starts per bundle and setting")
    ap.add_argument("--parity", type=int, default=1000, help="held-out tweets for the WASM parity pass")
    ap.add_argument("--webgpu-requests", type=int, default=30, help="tweets per WebGPU variant per round")
    ap.add_argument("--webgpu-parity", type=int, default=100, help="held-out tweets for the WebGPU parity")
    ap.add_argument("--kernel-trials", type=int, default=20, help="random inputs for the integer kernels")
    ap.add_argument("--no-webgpu", action="store_true", help="WASM and server rows only")
    ap.add_argument("--quick", action="store_true", help="tiny counts, one round; writes no report")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.rounds, args.cold, args.parity = 20, 1, 1, 20
        args.webgpu_requests, args.webgpu_parity, args.kernel_trials = 3, 3, 3
    with tempfile.TemporaryDirectory(prefix="ms-edge-") as work:
        text = measure(args, Path(work))
    if args.quick:
        print(text)
        print("quick run: the report above is not written")
        return
    write_section("edge", text, results=STORED.get("edge"))
    print("wrote the edge section of docs/benchmarks.md")


def measure(args: argparse.Namespace, work: Path) -> str:
    """Everything above, on bundles built in ``work``; the report's text."""
    repo, edge = build_repo(work)
    rows = splits(N_TRAIN, N_EVAL)["eval"]
    texts = [t for t, _ in rows]
    gpu = not args.no_webgpu
    variants = [
        Variant("INT8, WASM 1 thread", "sentiment", 1, None, False),
        Variant("INT8, WASM 2 threads", "sentiment", 2, None, False),
        Variant("FP32, WASM 1 thread", "sentiment_fp32", 1, None, False),
        Variant("server round trip (INT8)", "sentiment", 1, "server", False),
    ]
    if gpu:
        variants += [
            Variant(f"{p}, WebGPU", b, 1, None, True) for p, b in (("INT8", BUNDLES[0]), ("FP32", BUNDLES[1]))
        ]
    # (bundle, what the page asks for, a browser with WebGPU, the report's words for it)
    cold_settings = [
        (b, f"provider=wasm&threads={t}", False, f"wasm, {t} thread{'s' if t > 1 else ''}")
        for b in BUNDLES
        for t in (1, 2)
    ]
    if gpu:
        cold_settings += [
            (BUNDLES[0], "provider=webgpu", True, "webgpu"),
            (BUNDLES[0], "provider=auto", True, "auto (WASM and WebGPU timed, the faster kept)"),
        ]
    lat: dict[str, list[tuple[float, float]]] = {v.name: [] for v in variants}
    cold: dict[tuple[str, str], list[dict[str, Any]]] = {}
    checks: dict[str, dict[str, float]] = {}
    kernels: list[dict[str, Any]] = []
    adapter = None
    with ServerProcess(repo, "--edge", str(edge)) as server:
        origin = f"http://{server.http_url}"
        for rnd in range(args.cold):
            for bundle, query, webgpu, asked in cold_settings:
                c = cold_start(origin, bundle, query, webgpu)
                cold.setdefault((bundle, asked), []).append(c)
                first = c["first_answer_ms"]
                print(f"cold {rnd} {bundle} {query}: first answer {first:.0f} ms on {c['provider']}")
        with chromium() as plain, chromium(webgpu=gpu) as gpu_browser:
            pages = {}
            for v in variants:
                if (v.bundle, v.threads, v.gpu) not in pages:
                    context, query = (gpu_browser, FORCED_GPU) if v.gpu else (plain, f"{ROOMY}&provider=wasm")
                    pages[(v.bundle, v.threads, v.gpu)] = open_page(
                        context, origin, v.bundle, f"{query}&threads={v.threads}"
                    )
            if gpu:
                info = pages[(BUNDLES[0], 1, True)].evaluate(REPORT)
                adapter = info["adapter"]["name"]
                print("WebGPU adapter:", info["adapter"])
            for rnd in range(args.rounds):
                order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
                for v in order:
                    n = args.webgpu_requests if v.gpu else args.requests
                    chunk = texts[(rnd * n) % len(texts) :][:n]
                    provider = "webgpu" if v.gpu else "wasm"
                    ms = np.array(
                        pages[(v.bundle, v.threads, v.gpu)].evaluate(RUN, [chunk, v.prefer, provider])
                    )
                    p50, p99 = percentiles(ms, [50, 99])
                    lat[v.name].append((p50, p99))
                    print(
                        f"round {rnd} {v.name}: p50 {lat[v.name][-1][0]:.2f} p99 {lat[v.name][-1][1]:.2f} ms"
                    )
            for precision, bundle in (("INT8", BUNDLES[0]), ("FP32", BUNDLES[1])):
                checks[f"{precision}, WASM"] = parity(
                    pages[(bundle, 1, False)], origin, bundle, rows[: args.parity]
                )
                if gpu:
                    page = pages[(bundle, 1, True)]
                    checks[f"{precision}, WebGPU"] = parity(page, origin, bundle, rows[: args.webgpu_parity])
            kernels.append(integer_kernels(pages[(BUNDLES[0], 1, False)], "wasm", args.kernel_trials))
            if gpu:
                kernels.append(integer_kernels(pages[(BUNDLES[0], 1, True)], "webgpu", args.kernel_trials))
    for k, v in checks.items():
        print(k, v)
    for k in kernels:
        print("integer kernels:", k)
    STORED["edge"] = {  # for the results store
        "settings": {"run": vars(args), "adapter": adapter},
        "rounds": args.rounds,
        "values": {"latency": lat, "cold": cold, "kernels": kernels},
        "summary": {"parity": checks},
    }
    return report(args, edge, lat, cold, checks, kernels, adapter)


def adapter_label(adapter: str | None) -> str:
    if adapter is None:
        return "none"
    if "swiftshader" in adapter.lower():
        return f"{adapter}: Chromium's software adapter, a CPU emulating a GPU (this machine has no GPU)"
    return adapter


def kernel_sentence(k: dict[str, Any]) -> str:
    where = f" (ORT placed {', '.join(k['placed'])})" if k["placed"] else ""
    if k["exact"] == k["trials"]:
        found = f"bit-exact on all {k['trials']} random inputs"
    else:
        found = f"bit-exact on {k['exact']} of {k['trials']} random inputs, max |diff| {k['max_diff']:.3g}"
    return f"in a {k['provider']} session{where}: {found}"


def report(
    args: argparse.Namespace,
    edge: Path,
    lat: dict[str, list[tuple[float, float]]],
    cold: dict[tuple[str, str], list[dict[str, Any]]],
    checks: dict[str, dict[str, float]],
    kernels: list[dict[str, Any]],
    adapter: str | None,
) -> str:
    mib = 2**20
    command = (
        f"python benchmarks/edge.py --requests {args.requests} --rounds {args.rounds} --cold {args.cold} "
        f"--parity {args.parity}"
    )
    command += (
        " --no-webgpu"
        if args.no_webgpu
        else f" --webgpu-requests {args.webgpu_requests} --webgpu-parity {args.webgpu_parity}"
    )
    lines = [
        "## Browser edge: onnxruntime-web in Chromium against the server",
        "",
        f"`{command}` at {commit()}: {cpu_description()}; headless Chromium (Debian's), the server and "
        "the script share them. The example sentiment pipeline, bundled by `milliserve edge build --webgpu` "
        "with the INT8 model optimize shipped and with the FP32 model it started from. Pages load "
        "from the server on loopback: a real network adds the download. "
        f"WebGPU adapter: {adapter_label(adapter)}.",
        "",
        "**Bundle** (MiB; a page fetches the WASM runtime, or the WebGPU one where it gets an adapter, "
        "never both):",
        "",
        "| bundle | model | ORT WASM runtime | ORT WebGPU runtime | JavaScript | tokenizer | page, manifest "
        "| on disk | page without / with WebGPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in BUNDLES:
        s = sizes(edge / name)
        cells = " | ".join(f"{v / mib:.2f}" for v in s.values())
        total = sum(s.values())
        without, with_gpu = total - s["ORT WebGPU runtime"], total - s["ORT WASM runtime"]
        lines.append(f"| {name} | {cells} | {total / mib:.1f} | {without / mib:.1f} / {with_gpu / mib:.1f} |")
    lines += [
        "",
        f"**First answer, cold** (a fresh profile each time, medians of {args.cold}; ms from navigation "
        "start; session creation and warm-up summed over the providers the page timed):",
        "",
        "| bundle | page asks for | answered on | manifest | model download | session creation "
        "| warm-up (up to 8 runs each) | first answer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (bundle, asked), runs in cold.items():

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return float(np.median([r[key] for r in runs]))

        answered = "/".join(sorted({str(r["provider"]) for r in runs}))
        lines.append(
            f"| {bundle} | {asked} | {answered} | {med('manifest_ms'):.0f} | {med('download_ms'):.0f} | "
            f"{med('session_ms'):.0f} | {med('warmup_ms'):.0f} | **{med('first_answer_ms'):.0f}** |"
        )
    lines += [
        "",
        f"**Per request** (held-out tweets one at a time: {args.requests} per WASM and server variant, "
        f"{args.webgpu_requests} per WebGPU variant, per round; {args.rounds} interleaved rounds; medians "
        "of the rounds' percentiles):",
        "",
        "| where | p50 ms | p99 ms |",
        "|---|---|---|",
    ]
    for name, rounds in lat.items():
        p50 = float(np.median([r[0] for r in rounds]))
        p99 = float(np.median([r[1] for r in rounds]))
        where = f"{name} ({adapter})" if "WebGPU" in name else name
        lines.append(f"| {where} | {p50:.2f} | {p99:.2f} |")
    lines += [
        "",
        "**Parity** (held-out tweets, the page's model against the server's, batch 1; differences of the "
        "positive class's probability):",
        "",
        "| model, provider | tweets | labels agree | mean diff | p99 | max | within 1e-2 "
        "| accuracy page / server |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in checks.items():
        lines.append(
            f"| {name} | {c['n']} | {c['agree']:.1%} | {c['mean']:.1e} | {c['p99']:.1e} | {c['max']:.1e} | "
            f"{c['within_1e-2']:.1%} | {c['acc_edge']:.3f} / {c['acc_server']:.3f} |"
        )
    fp32 = checks["FP32, WASM"]
    lines += [
        "",
        f"FP32 is the same computation in both places: WASM's and AVX-512's float kernels differ by "
        f"{fp32['mean']:.1e} on average here. INT8 (dynamic quantization) requantizes every layer's "
        "activations, and now and then a float difference that small moves a value across a rounding "
        "step, which the next layers carry on. DynamicQuantizeLinear + MatMulInteger themselves, on "
        f"{KERNEL_SHAPE} inputs against ONNX Runtime on this CPU, compared bit for bit: "
        + "; ".join(kernel_sentence(k) for k in kernels)
        + ".",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
