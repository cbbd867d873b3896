"""``milliserve edge build REPO/MODEL``: a static bundle that runs one model in the browser.

The bundle holds the model file, its tokenizer when the model takes text, a manifest.json
that tells the JavaScript client how to call the model and which server model answers when
the page cannot, the client (onnxruntime-web + tokenizers.js, bundled with esbuild), ORT's
WASM runtime and a demo page. Nothing in it is fetched from a CDN.

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
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milliserve.config.model_config import ModelConfig, TensorConfig, load_model_config
from milliserve.config.steps import PipelineStep, Rules, TokenizerConfig
from milliserve.edge.assets import web_assets
from milliserve.errors import ConfigError

__all__ = ["EdgeBundle", "build_bundle", "model_precision"]

MANIFEST_FORMAT = 1
WARMUP_TEXT = "Just watched the new episode and honestly it was better than I expected!"
# a page downloading more than this is slow on most connections: said, not refused
LARGE_MODEL_BYTES = 100 << 20
_BROWSER_DATATYPES = ("FP32", "FP64", "INT64", "INT32")


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


def _latest_version(model_dir: Path, version: int | None) -> Path:
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise ConfigError(f"{model_dir}: no version folder (1/, 2/, ...)")
    if version is not None and version not in versions:
        raise ConfigError(f"{model_dir}: no version {version}; it has {versions}")
    return model_dir / str(version if version is not None else versions[-1])


def _config(repo: Path, name: str) -> ModelConfig:
    model_dir = repo / name
    if not model_dir.is_dir():
        known = sorted(p.name for p in repo.iterdir() if p.is_dir()) if repo.is_dir() else []
        raise ConfigError(f"no model {name!r} in {repo} (it has {', '.join(known) or 'no models'})")
    cfg = load_model_config(model_dir)
    if cfg is None:
        raise ConfigError(f"{model_dir}: no config.yaml or config.pbtxt")
    return cfg


def _onnx_model(cfg: ModelConfig, why: str) -> None:
    runs = cfg.backend or cfg.platform
    if runs not in ("onnxruntime", "onnxruntime_onnx"):
        raise ConfigError(
            f"{cfg.name} runs on {runs!r}; the browser runs ONNX models only (onnxruntime-web){why}"
        )
    if cfg.features is not None:
        raise ConfigError(f"{cfg.name} looks up features in a store: that needs the server")
    text = cfg.tokenizer.text_input if cfg.tokenizer is not None else None
    for t in cfg.input:
        if t.name != text and _datatype(t) not in _BROWSER_DATATYPES:
            raise ConfigError(
                f"{cfg.name}: input {t.name!r} is {t.data_type}; the page sends "
                f"{', '.join(_BROWSER_DATATYPES)}"
            )


def _datatype(t: TensorConfig) -> str:
    return t.data_type.removeprefix("TYPE_")


def _tokenizer_spec(tok: TokenizerConfig, to_model: dict[str, str], file: str) -> dict[str, Any]:
    return {
        "file": file,
        "text_input": tok.text_input,
        "ids": to_model.get(tok.ids, tok.ids),
        "mask": to_model.get(tok.mask, tok.mask) if tok.mask else None,
        "type_ids": None,
        "max_length": tok.max_length,
        "text_limit": tok.text_limit,
        "allow_empty": tok.allow_empty,
        # over this the page hands the text to the server (which truncates or refuses it)
        "edge_max_tokens": tok.max_length if tok.overflow == "refuse" else None,
    }


def _rules_spec(rules: Rules, to_model: dict[str, str]) -> dict[str, Any]:
    spec = rules.model_dump(mode="json")
    spec["input"] = to_model.get(rules.input, rules.input)
    return spec


def build_bundle(
    target: Path,
    out: Path,
    *,
    version: int | None = None,
    model_file: Path | None = None,
    budget_ms: float | None = None,
    threads: int = 0,
    bundle_name: str | None = None,
) -> EdgeBundle:
    """Write the bundle for ``target`` (``REPO/MODEL``) to ``out/<bundle_name or MODEL>/``."""
    repo, name = target.parent, target.name
    bundle_name = bundle_name or name
    if not bundle_name or bundle_name.startswith(".") or "/" in bundle_name or "\\" in bundle_name:
        raise ConfigError(f"bundle name {bundle_name!r}: a plain folder name, please")
    cfg = _config(repo, name)
    notes: list[str] = []
    tokenizer: TokenizerConfig | None = None
    tokenizer_dir = repo / name
    rules: Rules | None = None
    to_model: dict[str, str] = {}  # pipeline tensor -> model tensor
    model_cfg = cfg
    if cfg.ensemble_scheduling is not None:
        model_steps: list[PipelineStep] = []
        for i, step in enumerate(cfg.ensemble_scheduling.step):
            if step.tokenizer is not None and i == 0:
                tokenizer = step.tokenizer
            elif step.rules is not None and model_steps and i == len(cfg.ensemble_scheduling.step) - 1:
                rules = step.rules
            elif step.model_name and not (step.hedge or step.cascade):
                model_steps.append(step)
            else:
                kind = next(
                    (
                        k
                        for k in ("features", "python", "ann", "cascade", "hedge", "tokenizer", "rules")
                        if getattr(step, k) is not None
                    ),
                    "model",
                )
                raise ConfigError(
                    f"{name}: step {i + 1} ({kind}) cannot run in the browser; a bundle takes "
                    "[tokenizer] → one ONNX model → [rules]"
                )
        if len(model_steps) != 1:
            raise ConfigError(f"{name}: {len(model_steps)} model steps; a bundle takes exactly one")
        step = model_steps[0]
        model_cfg = _config(repo, step.model_name)
        to_model = {v: k for k, v in step.input_map.items()} | {v: k for k, v in step.output_map.items()}
        if step.model_version > 0 and version is None:
            version = step.model_version
        _onnx_model(model_cfg, f" (step {step.model_name} of pipeline {name})")
    else:
        _onnx_model(cfg, "")
        if cfg.tokenizer is not None:
            tokenizer = cfg.tokenizer
    if model_cfg.tokenizer is not None and tokenizer is None:
        tokenizer, tokenizer_dir = model_cfg.tokenizer, repo / model_cfg.name

    source = model_file or (_latest_version(repo / model_cfg.name, version) / "model.onnx")
    if not source.is_file():
        raise ConfigError(f"{source}: no such file")
    precision = model_precision(source)
    digest = _sha256(source)
    size = source.stat().st_size
    if size > LARGE_MODEL_BYTES:
        notes.append(f"the model is {size / 2**20:.0f} MiB: a long first download for a page")

    bundle = out / bundle_name
    if bundle.exists():
        shutil.rmtree(bundle)
    shutil.copytree(web_assets(), bundle, ignore=shutil.ignore_patterns(".complete"))
    versions = json.loads((bundle / "versions.json").read_text())
    model_name = f"model.{digest[:12]}.onnx"
    shutil.copy2(source, bundle / model_name)

    inputs = [{"name": t.name, "datatype": _datatype(t), "dims": list(t.dims)} for t in model_cfg.input]
    tokenizer_spec = None
    if tokenizer is not None:
        tok_path = tokenizer_dir / tokenizer.file
        if not tok_path.is_file():
            raise ConfigError(f"{tok_path}: no such file")
        tok_name = f"tokenizer.{_sha256(tok_path)[:12]}.json"
        shutil.copy2(tok_path, bundle / tok_name)
        tokenizer_spec = _tokenizer_spec(tokenizer, to_model, tok_name)
        model_inputs = {t.name for t in model_cfg.input}
        if "token_type_ids" in model_inputs:
            tokenizer_spec["type_ids"] = "token_type_ids"
        missing = model_inputs - {tokenizer_spec["ids"], tokenizer_spec["mask"], tokenizer_spec["type_ids"]}
        if missing:
            raise ConfigError(f"{model_cfg.name}: inputs {sorted(missing)} do not come from the tokenizer")
    budget = budget_ms or (cfg.budget.p99_ms if cfg.budget and cfg.budget.p99_ms else None) or 50.0
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "name": bundle_name,
        "built_with": {k: v for k, v in versions.items() if k != "ort_dir"},
        "model": {
            "file": model_name,
            "bytes": size,
            "sha256": digest,
            "precision": precision,
            "source": str(source.relative_to(repo)) if source.is_relative_to(repo) else str(source),
            "why": (
                "the file the server serves (what optimize shipped): both places run the same graph"
                if model_file is None
                else "chosen with --model-file"
            ),
        },
        "inputs": inputs,
        "outputs": [t.name for t in model_cfg.output],
        "tokenizer": tokenizer_spec,
        "rules": _rules_spec(rules, to_model) if rules is not None else None,
        "server": {
            "model": name,
            "infer_path": f"/v2/models/{name}/infer",
            "batched": cfg.max_batch_size > 0,
            "text_input": tokenizer.text_input if tokenizer is not None else None,
            "text_shape": ([1, 1] if cfg.max_batch_size > 0 else [1]) if tokenizer is not None else None,
        },
        "edge": {
            "budget_ms": budget,
            "threads": threads,
            "warmup_runs": 8,
            "warmup_input": WARMUP_TEXT if tokenizer is not None else _zeros(inputs),
            "wasm_path": versions["ort_dir"] + "/",
        },
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    return EdgeBundle(bundle, manifest, total, tuple(notes))


def _zeros(inputs: list[dict[str, Any]]) -> dict[str, list[float]]:
    out = {}
    for spec in inputs:
        n = 1
        for d in spec["dims"]:
            n *= d if d > 0 else 1
        out[spec["name"]] = [0.0] * n
    return out
