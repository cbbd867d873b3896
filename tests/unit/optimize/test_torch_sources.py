"""milliserve optimize with PyTorch sources: export checks, pruning, distillation, on the
digits CNN (scikit-learn's bundled digits) and a small random BERT."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from milliserve.errors import ConfigError
from milliserve.examples import digits
from milliserve.optimize.measure import EvalSet, load_arrays, predict, score
from milliserve.optimize.sources import ExportError, TorchModel, export_onnx, load_source, with_example
from milliserve.optimize.torch_variants import (
    CannotApply,
    TrainConfig,
    distill,
    finish_pruning,
    magnitude_prune,
    sparsity,
    structured_prune,
    student_from_layers,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return digits.write_data(tmp_path_factory.mktemp("digits"))


def _accuracy(module: Any, data: EvalSet) -> float:
    with torch.inference_mode():
        out = module(torch.from_numpy(data.inputs["input"])).numpy()
    return float((out.argmax(1) == data.labels).mean())


def test_factory_source_exports_with_a_dynamic_batch_and_matches_pytorch(
    data: dict[str, Path], tmp_path: Path
) -> None:
    src = load_source("milliserve.examples.digits:factory")
    assert src.torch is not None and src.onnx is None
    path = export_onnx(src.torch, tmp_path / "digits.onnx")
    ev = load_arrays(data["eval"])
    got = predict(path, ev)  # 397 rows through an export traced with 2
    with torch.inference_mode():
        want = src.torch.module(torch.from_numpy(ev.inputs["input"])).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert score("accuracy", got, ev, got) > 0.9


@pytest.mark.filterwarnings("ignore:`torch.jit.*is deprecated:DeprecationWarning")
def test_torchscript_source_takes_its_example_from_eval(data: dict[str, Path], tmp_path: Path) -> None:
    module, example = digits.factory()
    torch.jit.save(torch.jit.trace(module, example), str(tmp_path / "digits.pt"))
    src = load_source(tmp_path / "digits.pt")
    assert src.torch is not None and src.torch.example == {}
    ev = load_arrays(data["eval"])
    with_example(src.torch, ev.inputs)
    assert list(src.torch.example) == ["input"] and src.torch.example["input"].shape == (2, 1, 8, 8)
    path = export_onnx(src.torch, tmp_path / "ts.onnx")
    with torch.inference_mode():
        want = module(torch.from_numpy(ev.inputs["input"])).numpy()
    np.testing.assert_allclose(predict(path, ev), want, atol=1e-4)
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a TorchScript file"):
        load_source(tmp_path / "junk.pt")


class _Unexportable(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eig(x)[0].real


def unexportable() -> tuple[torch.nn.Module, torch.Tensor]:
    return _Unexportable(), torch.eye(3)[None].repeat(2, 1, 1)


def test_export_failure_names_the_operator(tmp_path: Path) -> None:
    src = load_source(f"{__name__}:unexportable")
    assert src.torch is not None
    with pytest.raises(ExportError, match="ONNX export"):
        export_onnx(src.torch, tmp_path / "bad.onnx")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope.module:factory", "cannot import"),
        ("missing.onnx", "no such ONNX file"),
        ("model.bin", "give an .onnx file"),
        ("milliserve.examples.digits:digits_data", r"must return \(nn.Module, example input\)"),
    ],
)
def test_bad_sources_are_named(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_source(spec)


def test_magnitude_pruning_reaches_the_target_sparsity(data: dict[str, Path]) -> None:
    module, _ = digits.factory()
    ev = load_arrays(data["eval"])
    pruned = finish_pruning(magnitude_prune(module, 0.5))
    assert sparsity(pruned) == pytest.approx(0.5, abs=0.01)
    assert sparsity(module) < 0.01  # the original is untouched
    assert _accuracy(pruned, ev) > 0.8


def test_structured_pruning_removes_channels_and_fine_tuning_recovers(
    data: dict[str, Path], tmp_path: Path
) -> None:
    module, example = digits.factory()
    ev, train = load_arrays(data["eval"]), load_arrays(data["train"])
    pruned, what = structured_prune(module, 0.5)
    assert "kept 56/112 hidden channels" in what  # 16 + 32 + 64 channels, half kept
    assert pruned[0].out_channels == 8 and pruned[5].in_features == 16 * 64
    distill(pruned, module, train, TrainConfig(epochs=3, lr=3e-3))
    assert _accuracy(pruned, ev) > 0.9
    path = export_onnx(TorchModel(pruned, {"input": example}), tmp_path / "pruned.onnx")
    assert (
        path.stat().st_size
        < 0.5 * export_onnx(TorchModel(module, {"input": example}), tmp_path / "full.onnx").stat().st_size
    )


def test_structured_pruning_says_why_it_cannot_apply() -> None:
    with pytest.raises(CannotApply, match="no structure to prune"):
        structured_prune(torch.nn.Sequential(torch.nn.Linear(4, 2)), 0.5)


def test_distilled_student_learns_from_the_teacher(data: dict[str, Path]) -> None:
    teacher, _ = digits.factory()
    ev, train = load_arrays(data["eval"]), load_arrays(data["train"])
    student = digits.small_student()
    before = _accuracy(student, ev)
    distill(student, teacher, train, TrainConfig(epochs=4, lr=3e-3, temperature=2.0, alpha=0.7))
    assert before < 0.3 and _accuracy(student, ev) > 0.85


def _tiny_bert(attn: str = "eager") -> Any:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        attn_implementation=attn,
    )
    return BertModel(cfg).eval()


def test_bert_heads_and_ffn_channels_are_pruned_and_the_model_still_runs(tmp_path: Path) -> None:
    bert = _tiny_bert()
    pruned, what = structured_prune(bert, 0.5)
    assert what == "kept 12/24 attention heads and 192/384 FFN channels"
    layer = pruned.encoder.layer[0]
    assert layer.attention.self.query.out_features == 16 and layer.intermediate.dense.out_features == 32
    ids = torch.randint(1, 100, (2, 10))
    mask = torch.ones_like(ids)
    out = pruned(input_ids=ids, attention_mask=mask).last_hidden_state
    assert out.shape == (2, 10, 32) and torch.isfinite(out).all()
    path = export_onnx(
        TorchModel(_Pooled(pruned), {"input_ids": ids, "attention_mask": mask}), tmp_path / "b.onnx"
    )
    feeds = {
        "input_ids": ids.numpy()[:, :7],
        "attention_mask": mask.numpy()[:, :7],
    }  # the sequence axis is dynamic
    assert predict(path, EvalSet(feeds)).shape == (2, 32)


class _Pooled(torch.nn.Module):
    def __init__(self, bert: Any) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]  # type: ignore[no-any-return]


def test_student_keeps_evenly_spaced_teacher_layers() -> None:
    bert = _tiny_bert()
    student, what = student_from_layers(bert, 2)
    assert len(student.encoder.layer) == 2 and len(bert.encoder.layer) == 6
    assert what == "layers [0, 5] of the teacher's 6 (encoder.layer)"
    assert (
        student.encoder.layer[1].output.dense.weight.data_ptr()
        != bert.encoder.layer[5].output.dense.weight.data_ptr()
    )
    torch.testing.assert_close(
        student.encoder.layer[1].output.dense.weight, bert.encoder.layer[5].output.dense.weight
    )
    with pytest.raises(CannotApply, match="no layer stack"):
        student_from_layers(digits.digits_cnn(), 1)


def test_cli_optimizes_a_pytorch_factory_and_the_winner_serves(data: dict[str, Path], tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    import tritonclient.http as httpclient

    from milliserve.testing import ServerProcess

    out = tmp_path / "repo" / "digits"
    cmd = [
        sys.executable,
        "-m",
        "milliserve",
        "optimize",
        "milliserve.examples.digits:factory",
        "--eval",
        str(data["eval"]),
        "--calibration",
        str(data["calib"]),
        "--train",
        str(data["train"]),
        "--student",
        "milliserve.examples.digits:small_student",
        "--epochs",
        "3",
        "--lr",
        "3e-3",
        "--batches",
        "1,8",
        "--rounds",
        "2",
        "--final-rounds",
        "5",
        "--output",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    rows = {row["name"]: row for row in report["rows"]}
    built = {n for n, row in rows.items() if not row["skipped"]}
    assert {
        "fp32",
        "int8_dynamic",
        "pruned_magnitude",
        "pruned_structured",
        "student",
        "student_int8_dynamic",
    } <= built
    assert (
        rows["student"]["quality"] > 0.85 and "distilled (KL at T=2.0, alpha=0.5" in rows["student"]["note"]
    )
    assert "50% of Linear/Conv weights zeroed" in rows["pruned_magnitude"]["note"]
    assert (
        not rows["openvino_f32"]["skipped"]
        and not report["winner"].startswith(("openvino", "nncf"))
        and rows["bert_fused"]["skipped"] == "no BERT-like attention found to fuse"
    )
    assert (
        "fine-tuning pruned_structured" in r.stderr and "distilling the student" in r.stderr
    )  # progress bars
    x = load_arrays(data["eval"]).inputs["input"][:5]
    expected = predict(out / "1" / "model.onnx", EvalSet({"input": x}))
    with ServerProcess(out.parent) as server, httpclient.InferenceServerClient(server.http_url) as client:
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("digits", [inp]).as_numpy("output")
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert (got.argmax(1) == load_arrays(data["eval"]).labels[:5]).mean() >= 0.8


def test_bert_fusions_apply_to_an_exported_bert_and_keep_its_outputs(tmp_path: Path) -> None:
    from milliserve.optimize.cpu import cpu_info
    from milliserve.optimize.variants import build_variants

    ids = torch.randint(1, 100, (4, 12))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    path = export_onnx(
        TorchModel(_Pooled(_tiny_bert()), {"input_ids": ids, "attention_mask": mask}), tmp_path / "b.onnx"
    )
    variants = {
        v.name: v
        for v in build_variants(path, tmp_path / "v", cpu_info(), only=["bert_fused", "int8_dynamic"])
    }
    fused = variants["bert_fused"]
    assert fused.path is not None, fused.skipped
    assert "Attention" in fused.note and "INT8 dynamic quantizes this graph" in fused.note
    data = EvalSet({"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    np.testing.assert_allclose(predict(fused.path, data), predict(path, data), atol=1e-4)
    assert variants["int8_dynamic"].path is not None
    np.testing.assert_allclose(predict(variants["int8_dynamic"].path, data), predict(path, data), atol=0.1)


def test_a_bert_with_sdpa_attention_is_exported_so_that_it_fuses(tmp_path: Path) -> None:
    """transformers' default attention (SDPA) exports as a pattern ORT's fusion does not
    know. milliserve exports with eager attention (and restores SDPA afterwards); a user's
    own SDPA export is reported as unfusable, with the reason."""
    from milliserve.optimize.cpu import cpu_info
    from milliserve.optimize.variants import build_variants

    bert = _tiny_bert("sdpa")
    ids = torch.randint(1, 100, (4, 12))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    ours = export_onnx(
        TorchModel(_Pooled(bert), {"input_ids": ids, "attention_mask": mask}), tmp_path / "ours.onnx"
    )
    assert bert.config._attn_implementation == "sdpa"  # restored after the export
    theirs = tmp_path / "theirs.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Pooled(bert),
            (ids, mask),
            str(theirs),
            input_names=["input_ids", "attention_mask"],
            output_names=["output"],
            opset_version=17,
            dynamo=False,
            dynamic_axes={"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}},
        )
    fused = build_variants(ours, tmp_path / "a", cpu_info(), only=["bert_fused"])[0]
    assert fused.path is not None and "Attention" in fused.note, fused.skipped
    unfused = build_variants(theirs, tmp_path / "b", cpu_info(), only=["bert_fused"])[0]
    assert unfused.path is None and "SDPA attention is not a pattern it knows" in unfused.skipped
