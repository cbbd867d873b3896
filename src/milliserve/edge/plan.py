"""What a browser bundle of ``REPO/MODEL`` holds, resolved as the server resolves it: the
backend found the server's way (``backend``, ``platform``, or the model file), the config
completed from the model itself when it has none, and a pipeline's tensor names mapped to
its model's. Anything the page cannot run is refused here, naming the reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milliserve.config.model_config import ModelConfig, TensorConfig, load_model_config
from milliserve.config.step_config import PipelineStep, Rules, TokenizerConfig
from milliserve.errors import ConfigError, MilliserveError

__all__ = ["Plan", "plan_bundle"]

BROWSER_DATATYPES = ("FP32", "FP64", "INT64", "INT32")


@dataclass
class Plan:
    """What to ship: the target (model or pipeline) and the one ONNX model that runs."""

    name: str
    target: ModelConfig  # what the server answers for (the fallback)
    model: ModelConfig  # the ONNX model, its config as the server completes it
    source: Path  # the .onnx file
    version: int | None  # the model version shipped (None: --model-file)
    tokenizer: TokenizerConfig | None = None
    tokenizer_dir: Path | None = None
    rules: Rules | None = None
    to_model: dict[str, str] = field(default_factory=dict)  # pipeline tensor -> model tensor
    from_optimize: bool = False  # optimize's report.md sits beside the model


def _versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def _config(repo: Path, name: str) -> ModelConfig | None:
    model_dir = repo / name
    if not model_dir.is_dir():
        known = sorted(p.name for p in repo.iterdir() if p.is_dir()) if repo.is_dir() else []
        raise ConfigError(f"no model {name!r} in {repo} (it has {', '.join(known) or 'no models'})")
    return load_model_config(model_dir)


def _served_config(
    repo: Path, name: str, cfg: ModelConfig | None, version: int | None, model_file: Path | None, why: str
) -> tuple[ModelConfig, Path, int | None]:
    """The model's config as the server would serve it, and its .onnx file."""
    from milliserve.backends.onnxruntime import tensor_spec
    from milliserve.backends.registry import factory_for
    from milliserve.runtime.autocomplete import complete_config

    model_dir = repo / name
    versions = _versions(model_dir)
    if model_file is None:
        if not versions:
            raise ConfigError(f"{model_dir}: no version folder (1/, 2/, ...)")
        if version is not None and version not in versions:
            raise ConfigError(f"{model_dir}: no version {version}; it has {versions}")
        version = version if version is not None else versions[-1]
        version_dir = model_dir / str(version)
        runs = factory_for(cfg, version_dir, f"{model_dir}").name
        source = version_dir / "model.onnx"
    else:
        runs = (cfg.backend or cfg.platform) if cfg is not None else ""
        runs = "onnxruntime" if runs in ("", "onnxruntime_onnx") else runs
        source, version = model_file, None
    if runs != "onnxruntime":
        raise ConfigError(
            f"{name} runs on {runs!r}; the browser runs ONNX models only (onnxruntime-web){why}"
        )
    if cfg is not None and cfg.features is not None:
        raise ConfigError(f"{name} looks up features in a store: that needs the server")
    if not source.is_file():
        raise ConfigError(f"{source}: no such file")
    import onnxruntime as ort

    from milliserve.backends.base import BackendInfo

    try:
        session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        info = BackendInfo(
            inputs=tuple(tensor_spec(i) for i in session.get_inputs()),
            outputs=tuple(tensor_spec(o) for o in session.get_outputs()),
            platform="onnxruntime_onnx",
        )
    except MilliserveError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{source}: not an ONNX model ONNX Runtime can load ({first})") from None
    try:
        served = complete_config(cfg, name, info, f"{source} against {model_dir}'s config")
    except ConfigError as exc:
        raise ConfigError(f"{exc.message} (is {source} this model's file?)") from None
    text = served.tokenizer.text_input if served.tokenizer is not None else None
    for t in served.input:
        if t.name != text and datatype(t) not in BROWSER_DATATYPES:
            raise ConfigError(
                f"{name}: input {t.name!r} is {t.data_type}; the page sends {', '.join(BROWSER_DATATYPES)}"
            )
    return served, source, version


def datatype(t: TensorConfig) -> str:
    return t.data_type.removeprefix("TYPE_")


def _pipeline_steps(name: str, cfg: ModelConfig) -> tuple[TokenizerConfig | None, PipelineStep, Rules | None]:
    assert cfg.ensemble_scheduling is not None
    steps = cfg.ensemble_scheduling.step
    tokenizer: TokenizerConfig | None = None
    rules: Rules | None = None
    models: list[PipelineStep] = []
    for i, step in enumerate(steps):
        if step.tokenizer is not None and i == 0:
            tokenizer = step.tokenizer
        elif step.rules is not None and models and i == len(steps) - 1:
            rules = step.rules
        elif step.model_name and not (step.hedge or step.cascade):
            models.append(step)
        else:
            kinds = ("features", "python", "ann", "cascade", "hedge", "tokenizer", "rules")
            kind = next((k for k in kinds if getattr(step, k) is not None), "model")
            raise ConfigError(
                f"{name}: step {i + 1} ({kind}) cannot run in the browser; a bundle takes "
                "[tokenizer] → one ONNX model → [rules]"
            )
    if len(models) != 1:
        raise ConfigError(f"{name}: {len(models)} model steps; a bundle takes exactly one")
    return tokenizer, models[0], rules


def plan_bundle(target: Path, version: int | None = None, model_file: Path | None = None) -> Plan:
    repo, name = target.parent, target.name
    cfg = _config(repo, name)
    if cfg is not None and cfg.ensemble_scheduling is not None:
        tokenizer, step, rules = _pipeline_steps(name, cfg)
        if step.model_version > 0 and version is None:
            version = step.model_version
        inner = _config(repo, step.model_name)
        why = f" (step {step.model_name} of pipeline {name})"
        model, source, version = _served_config(repo, step.model_name, inner, version, model_file, why)
        plan = Plan(name, cfg, model, source, version, tokenizer, repo / name, rules)
        plan.to_model = {v: k for k, v in step.input_map.items()} | {v: k for k, v in step.output_map.items()}
    else:
        model, source, version = _served_config(repo, name, cfg, version, model_file, "")
        plan = Plan(name, model, model, source, version, model.tokenizer, repo / name)
    if plan.tokenizer is None and plan.model.tokenizer is not None:  # a pipeline's text model
        plan.tokenizer, plan.tokenizer_dir = plan.model.tokenizer, repo / plan.model.name
    plan.from_optimize = model_file is None and (source.parent.parent / "report.md").is_file()
    return plan


def tokenizer_spec(plan: Plan, file: str) -> dict[str, Any]:
    tok = plan.tokenizer
    assert tok is not None
    to_model = plan.to_model
    spec: dict[str, Any] = {
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
    model_inputs = {t.name for t in plan.model.input}
    if "token_type_ids" in model_inputs:
        spec["type_ids"] = "token_type_ids"
    missing = model_inputs - {spec["ids"], spec["mask"], spec["type_ids"]}
    if missing:
        raise ConfigError(f"{plan.model.name}: inputs {sorted(missing)} do not come from the tokenizer")
    return spec


def rules_spec(plan: Plan) -> dict[str, Any] | None:
    if plan.rules is None:
        return None
    spec = plan.rules.model_dump(mode="json")
    spec["input"] = plan.to_model.get(plan.rules.input, plan.rules.input)
    return spec


def inputs_spec(plan: Plan) -> list[dict[str, Any]]:
    """The model's inputs (fed in the page) with the names the server takes for them."""
    to_pipeline = {m: p for p, m in plan.to_model.items()}
    return [
        {
            "name": t.name,
            "server_name": to_pipeline.get(t.name, t.name),
            "datatype": datatype(t),
            "dims": list(t.dims),
        }
        for t in plan.model.input
    ]
