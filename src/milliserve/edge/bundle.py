"""``milliserve edge build REPO/MODEL``: a static bundle that runs one model in the browser.

The bundle holds the model file, its tokenizer when the model takes text, a manifest.json
that tells the JavaScript client how to call the model and which server model answers when
the page cannot, the client (onnxruntime-web + tokenizers.js, bundled with esbuild), ORT's
WASM runtime (and its WebGPU one with ``--webgpu``, see ``webgpu.py``) and a demo page.
Nothing in it is fetched from a CDN.

What can run in the page: an ONNX model (``onnxruntime`` backend), optionally with its own
tokenizer, or a pipeline of [tokenizer] → one ONNX model → [rules]. Anything else (feature
lookups, Python steps, OpenVINO IR, cascades, ...) needs the server and is refused with the
reason.

The model file is the one the server serves (what ``optimize`` shipped), so both places run
the same graph; its content hash is in its name, so browsers may cache it for good.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milliserve.edge.assets import web_assets
from milliserve.edge.plan import Plan, inputs_spec, plan_bundle, rules_spec, tokenizer_spec
from milliserve.edge.webgpu import check_webgpu_options, half_model, unused_runtime_files, webgpu_spec
from milliserve.errors import ConfigError

__all__ = ["EdgeBundle", "build_bundle", "model_precision"]

MANIFEST_FORMAT = 1
WARMUP_TEXT = "Just watched the new episode and honestly it was better than I expected!"
# a page downloading more than this is slow on most connections: said, not refused
LARGE_MODEL_BYTES = 100 << 20


@dataclass(frozen=True)
class EdgeBundle:
    path: Path
    manifest: dict[str, Any]
    total_bytes: int
    notes: tuple[str, ...]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_precision(path: Path) -> str:
    """What the ONNX file computes in: int4, int8 (dynamic or static), fp16 or fp32."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    if any(
        i.HasField("data_location") and i.data_location == onnx.TensorProto.EXTERNAL
        for i in model.graph.initializer
    ):
        raise ConfigError(
            f"{path}: its weights are in external data files; the browser bundle takes one "
            "self-contained .onnx (save it without external data)"
        )
    if "MatMulNBits" in ops:
        return "int4"
    if ops & {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul"}:
        return "int8 (dynamic)"
    if any(op.startswith("QLinear") for op in ops) or "QuantizeLinear" in ops:
        return "int8 (static)"
    if any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer):
        return "fp16"
    return "fp32"


def _check_options(budget_ms: float | None, threads: int, bundle_name: str) -> None:
    if budget_ms is not None and not (budget_ms > 0 and math.isfinite(budget_ms)):
        raise ConfigError(f"--budget-ms {budget_ms}: a positive number of milliseconds")
    if threads < 0:
        raise ConfigError(f"--threads {threads}: 0 (ORT's choice) or more")
    if not bundle_name or bundle_name.startswith(".") or "/" in bundle_name or "\\" in bundle_name:
        raise ConfigError(f"bundle name {bundle_name!r}: a plain folder name, please")


def _destination(out: Path, bundle_name: str, repo: Path) -> Path:
    """OUT/NAME, refused when it is inside the model repository or is a folder that is not
    an earlier bundle (a rebuild replaces a bundle, never anything else)."""
    bundle = out / bundle_name
    if out.resolve() == repo.resolve() or out.resolve().is_relative_to(repo.resolve()):
        raise ConfigError(f"--out {out} is inside the model repository {repo}: write bundles elsewhere")
    if bundle.exists() and not (bundle / "manifest.json").is_file():
        raise ConfigError(f"{bundle} exists and is not an edge bundle (no manifest.json): not replacing it")
    return bundle


def _manifest(
    plan: Plan,
    bundle_name: str,
    files: dict[str, str],
    versions: dict[str, str],
    budget_ms: float | None,
    threads: int,
    size: int,
    digest: str,
    provider: str,
    webgpu: dict[str, Any] | None,
) -> dict[str, Any]:
    target, model = plan.target, plan.model
    tokenizer = plan.tokenizer
    inputs = inputs_spec(plan)
    repo = plan.source.parents[2] if plan.version is not None else None
    if plan.from_optimize:
        why = "the file the server serves, as optimize shipped it (report.md beside it)"
    elif plan.version is not None:
        why = "the file the server serves: the same graph in both places"
    else:
        why = "chosen with --model-file"
    budget = budget_ms or (target.budget.p99_ms if target.budget and target.budget.p99_ms else None) or 50.0
    # a plain model's fallback names the version the page runs; a pipeline's cannot
    pinned = plan.version is not None and target is model
    path = (
        f"/v2/models/{plan.name}/versions/{plan.version}/infer" if pinned else f"/v2/models/{plan.name}/infer"
    )
    return {
        "format": MANIFEST_FORMAT,
        "name": bundle_name,
        "built_with": {k: v for k, v in versions.items() if k not in ("ort_dir", "webgpu_flavours")},
        "model": {
            "file": files["model"],
            "bytes": size,
            "sha256": digest,
            "precision": model_precision(plan.source),
            "batched": model.max_batch_size > 0,
            "source": str(plan.source.relative_to(repo)) if repo is not None else str(plan.source),
            "version": plan.version,
            "why": why,
        },
        "inputs": inputs,
        "outputs": [t.name for t in model.output],
        "tokenizer": tokenizer_spec(plan, files["tokenizer"]) if tokenizer is not None else None,
        "rules": rules_spec(plan),
        "server": {
            "model": plan.name,
            "infer_path": path,
            "batched": target.max_batch_size > 0,
            "text_input": tokenizer.text_input if tokenizer is not None else None,
            "text_shape": ([1, 1] if target.max_batch_size > 0 else [1]) if tokenizer is not None else None,
        },
        "edge": {
            "budget_ms": budget,
            "threads": threads,
            "warmup_runs": 8,
            "warmup_input": WARMUP_TEXT if tokenizer is not None else _zeros(inputs),
            "wasm_path": versions["ort_dir"] + "/",
            "provider": provider,
            "webgpu": webgpu,
        },
    }


def build_bundle(
    target: Path,
    out: Path,
    *,
    version: int | None = None,
    model_file: Path | None = None,
    budget_ms: float | None = None,
    threads: int = 0,
    bundle_name: str | None = None,
    webgpu: str | None = None,
    provider: str = "auto",
    fp16: bool = False,
) -> EdgeBundle:
    """Write the bundle for ``target`` (``REPO/MODEL``) to ``out/<bundle_name or MODEL>/``.
    The bundle is written beside its destination and swapped in at the end: a failed build
    leaves the earlier bundle as it was. ``webgpu`` ("jspi" or "asyncify") ships that WebGPU
    runtime too; ``provider`` is the pages' default ("auto": the faster by measurement);
    ``fp16`` adds an FP16 copy of an FP32 model for adapters with shader-f16."""
    bundle_name = bundle_name or target.name
    _check_options(budget_ms, threads, bundle_name)
    check_webgpu_options(webgpu, provider, fp16)
    bundle = _destination(out, bundle_name, target.parent)
    plan = plan_bundle(target, version, model_file)
    notes: list[str] = []
    size = plan.source.stat().st_size
    if size > LARGE_MODEL_BYTES:
        notes.append(f"the model is {size / 2**20:.0f} MiB: a long first download for a page")
    digest = _sha256(plan.source)
    assets = web_assets()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{bundle_name}-") as tmp:
        staging = Path(tmp) / bundle_name
        versions = json.loads((assets / "versions.json").read_text())
        unused = unused_runtime_files(versions, webgpu) | {".complete"}
        shutil.copytree(assets, staging, ignore=lambda _dir, names: [n for n in names if n in unused])
        files = {"model": f"model.{digest[:12]}.onnx"}
        shutil.copy2(plan.source, staging / files["model"])
        if plan.tokenizer is not None:
            assert plan.tokenizer_dir is not None
            tok_path = plan.tokenizer_dir / plan.tokenizer.file
            if not tok_path.is_file():
                raise ConfigError(f"{tok_path}: no such file")
            files["tokenizer"] = f"tokenizer.{_sha256(tok_path)[:12]}.json"
            shutil.copy2(tok_path, staging / files["tokenizer"])
        gpu = None
        if webgpu is not None:
            half = half_model(plan.source, staging, model_precision(plan.source)) if fp16 else None
            gpu = webgpu_spec(versions, webgpu, staging, half)
        manifest = _manifest(
            plan, bundle_name, files, versions, budget_ms, threads, size, digest, provider, gpu
        )
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
        old = Path(tmp) / "previous"
        if bundle.exists():
            bundle.rename(old)
        staging.rename(bundle)
    total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    return EdgeBundle(bundle, manifest, total, tuple(notes))


def _zeros(inputs: list[dict[str, Any]]) -> dict[str, list[float]]:
    out = {}
    for spec in inputs:
        n = 1
        for d in spec["dims"]:
            n *= d if d > 0 else 1
        out[spec["server_name"]] = [0.0] * n
    return out
