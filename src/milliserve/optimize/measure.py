"""Score and time every variant fairly: the same evaluation data, one pinned thread
count, and latency measured round-robin (A B C A B C ...) in one process."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.errors import ConfigError
from milliserve.percentiles import percentiles

__all__ = [
    "METRICS",
    "RECALL_K",
    "EvalSet",
    "ModelRef",
    "Timing",
    "embedding_measures",
    "load_arrays",
    "measure_rounds",
    "metric_function",
    "predict",
    "score",
]

Feeds = dict[str, np.ndarray[Any, Any]]
BATCHES = (1, 8, 32)
METRICS = ("accuracy", "cosine", "embedding")
RECALL_K = 10  # the embedding metric's recall@k
# the embedding metric's recall@10 may lose this many times what its cosine may: with the
# default tolerance 0.01, cosine >= 0.99 and recall@10 >= 0.97 (issue 63's gates)
RECALL_SLACK = 3.0


@dataclass
class EvalSet:
    inputs: Feeds
    labels: np.ndarray[Any, Any] | None = None
    fixed_batch: int | None = None  # the model's static batch size: run in chunks of exactly this

    @property
    def rows(self) -> int:
        return len(next(iter(self.inputs.values())))


def load_arrays(path: Path) -> EvalSet:
    """Read an .npz of named input arrays (plus optional ``labels``). Pickles are refused."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{path}: not a readable .npz of arrays ({exc})") from None
    labels = arrays.pop("labels", None)
    if not arrays:
        raise ConfigError(f"{path}: holds no input arrays")
    if any(a.ndim == 0 or len(a) == 0 for a in arrays.values()):
        raise ConfigError(f"{path}: every input array needs at least one row")
    if (
        labels is not None
        and labels.dtype.kind == "f"
        and labels.ndim == 1
        and np.all(labels == np.round(labels))
    ):
        labels = labels.astype(np.int64)  # whole numbers saved as floats (pandas does this)
    if labels is not None and (labels.ndim != 1 or labels.dtype.kind not in "iub"):
        raise ConfigError(
            f"{path}: 'labels' must be one integer class index per row (shape [rows]), "
            f"got {labels.dtype} with shape {list(labels.shape)}"
        )
    rows = {len(a) for a in arrays.values()}
    if len(rows) != 1 or (labels is not None and len(labels) not in rows):
        raise ConfigError(f"{path}: arrays disagree on the number of rows ({sorted(rows)})")
    return EvalSet(arrays, labels)


@dataclass(frozen=True)
class ModelRef:
    """A model file and the runtime that runs it (OpenVINO with its precision pinned)."""

    path: Path
    runtime: str = "onnxruntime"  # or "openvino", or "torch_compile" (a reference, not servable)
    precision: str = ""  # OpenVINO INFERENCE_PRECISION_HINT: f32 or bf16
    # torch_compile: the TorchModel to compile (its example gives the input order)
    module: Any = field(default=None, compare=False, hash=False)


class _OpenVinoRunner:
    """The subset of an ORT session's interface that predict/measure use."""

    def __init__(self, ref: ModelRef, threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        config = {
            # pinned: on CPUs with bf16 OpenVINO would otherwise choose bf16 silently
            "INFERENCE_PRECISION_HINT": ref.precision or "f32",
            "INFERENCE_NUM_THREADS": str(threads),
            "PERFORMANCE_HINT": "LATENCY",
        }
        self.compiled = core.compile_model(str(ref.path), "CPU", config)
        self.request = self.compiled.create_infer_request()

    def run(self, _: Any, feeds: Feeds) -> list[np.ndarray[Any, Any]]:
        result = self.request.infer(feeds)
        return [np.asarray(result[o]) for o in self.compiled.outputs]


class _TorchCompiledRunner:
    """``torch.compile`` (inductor) of the PyTorch source, run with the same thread count."""

    def __init__(self, ref: ModelRef, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self._names = list(ref.module.example)
        self._fn = torch.compile(ref.module.module, backend="inductor")

    def run(self, _: Any, feeds: Feeds) -> list[np.ndarray[Any, Any]]:
        import torch

        with torch.inference_mode():
            out = self._fn(*(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self._names))  # type: ignore[no-untyped-call]
        if isinstance(out, torch.Tensor):
            out = (out,)
        elif isinstance(out, dict):
            out = tuple(out.values())
        return [o.detach().numpy() for o in out]


def _runner(model: Path | ModelRef, threads: int) -> Any:
    ref = model if isinstance(model, ModelRef) else ModelRef(model)
    if ref.runtime == "openvino":
        return _OpenVinoRunner(ref, threads)
    if ref.runtime == "torch_compile":
        return _TorchCompiledRunner(ref, threads)
    return _session(ref.path, threads)


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 4
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def check_inputs(path: Path, data: EvalSet, what: str) -> None:
    """Raise ConfigError when the data's names or shapes do not fit the model."""
    sess = _session(path, 1)
    wanted = {i.name: i for i in sess.get_inputs()}
    if set(wanted) != set(data.inputs):
        raise ConfigError(f"{what} has inputs {sorted(data.inputs)} but the model takes {sorted(wanted)}")
    for name, arr in data.inputs.items():
        kind = wanted[name].type.removeprefix("tensor(").rstrip(")")
        expected = {"float": "float32", "double": "float64", "float16": "float16", "bool": "bool"}.get(
            kind, kind
        )
        if kind != "string" and str(arr.dtype) != expected:
            raise ConfigError(
                f"{what} input {name!r} holds {arr.dtype} but the model takes {expected}; "
                f"save it as {expected} (numpy arrays default to float64 and int64)"
            )
        dims = wanted[name].shape
        fixed = [(i, d) for i, d in enumerate(dims) if isinstance(d, int) and i > 0]
        if len(dims) != arr.ndim or any(arr.shape[i] != d for i, d in fixed):
            raise ConfigError(
                f"{what} input {name!r} has shape {list(arr.shape)} but the model expects {dims}"
            )


def predict(path: Path | ModelRef, data: EvalSet, threads: int = 1, chunk: int = 256) -> np.ndarray[Any, Any]:
    """The model's first output over the whole set, in chunks (of exactly the model's static
    batch size when it has one: the last chunk is padded with its last row, then trimmed)."""
    sess = _runner(path, threads)
    chunk = data.fixed_batch or chunk
    outs = []
    for start in range(0, data.rows, chunk):
        feeds = {k: v[start : start + chunk] for k, v in data.inputs.items()}
        short = chunk - len(next(iter(feeds.values())))
        if data.fixed_batch and short:
            feeds = {k: np.concatenate([v, np.repeat(v[-1:], short, axis=0)]) for k, v in feeds.items()}
        out = sess.run(None, feeds)[0]
        outs.append(out[: chunk - short] if data.fixed_batch else out)
    return np.concatenate(outs)


def static_batch(path: Path) -> int | None:
    """The batch size every input fixes in its first dimension, or None when it is dynamic."""
    dims = {i.shape[0] if i.shape else None for i in _session(path, 1).get_inputs()}
    fixed = [d for d in dims if isinstance(d, int) and d > 0]
    return fixed[0] if fixed and len(dims) == 1 else None


def metric_function(metric: str) -> Any:
    """Resolve a ``module:function`` metric; raises ConfigError when it cannot be imported."""
    import importlib

    mod, _, attr = metric.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"metric {metric!r}: cannot import it ({exc})") from None


def score(
    metric: str, outputs: np.ndarray[Any, Any], data: EvalSet, reference: np.ndarray[Any, Any]
) -> float:
    """``accuracy`` against the labels, mean ``cosine`` similarity to the FP32 outputs,
    ``embedding`` (``embedding_measures``: the lower of the mean cosine and recall@10 put on
    cosine's scale) or a user function ``module:function(outputs, labels, reference) ->
    float`` (higher is better)."""
    if ":" in metric:
        return float(metric_function(metric)(outputs, data.labels, reference))
    if metric == "accuracy":
        if data.labels is None:
            raise ConfigError("metric 'accuracy' needs a 'labels' array in the EVAL file")
        return float((outputs.argmax(-1) == data.labels).mean())
    if metric == "embedding":
        return embedding_measures(outputs, data, reference)["quality"]
    a = outputs.reshape(len(outputs), -1).astype(np.float64)
    b = reference.reshape(len(reference), -1).astype(np.float64)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return float(cos.mean())


def _sentence_vectors(outputs: np.ndarray[Any, Any], data: EvalSet) -> np.ndarray[Any, Any]:
    """Unit vectors, one a row: token embeddings ([rows, tokens, dim]) are mean-pooled over
    the EVAL set's ``attention_mask`` first (what an embedding pipeline's pooling step does),
    sentence embeddings ([rows, dim]) are taken as they are."""
    x = outputs.astype(np.float64)
    if x.ndim == 3:
        mask = data.inputs.get("attention_mask")
        if mask is None or mask.shape[:2] != x.shape[:2]:
            raise ConfigError(
                "metric 'embedding' on token embeddings [rows, tokens, dim] needs an 'attention_mask' "
                f"input of shape [rows, tokens] in EVAL to pool them; outputs are {list(x.shape)}"
            )
        m = mask.astype(np.float64)[..., None]
        x = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    elif x.ndim != 2:
        raise ConfigError(
            f"metric 'embedding' takes sentence [rows, dim] or token [rows, tokens, dim] embeddings, "
            f"not outputs of shape {list(x.shape)}"
        )
    unit: np.ndarray[Any, Any] = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return unit


def _neighbours(queries: np.ndarray[Any, Any], index: np.ndarray[Any, Any], k: int) -> np.ndarray[Any, Any]:
    """Each query's ``k`` nearest rows of ``index`` by inner product, its own row left out."""
    sims = queries @ index.T
    np.fill_diagonal(sims, -np.inf)
    return np.argpartition(-sims, k, axis=1)[:, :k]


def embedding_measures(
    outputs: np.ndarray[Any, Any], data: EvalSet, reference: np.ndarray[Any, Any]
) -> dict[str, float]:
    """How well a variant's embeddings stand in for FP32's on EVAL's texts.

    - ``cosine``: the mean cosine of each text's vector to FP32's vector of it;
    - ``recall_at_10``: the FP32 vectors of the EVAL texts are the index; each text is a
      query, embedded by the variant, searched exactly against that index (its own row left
      out) and compared with the 10 neighbours FP32's query finds there: the mean share found;
    - ``quality``: what optimize ranks and gates on, ``min(cosine, 1 - (1 - recall) / 3)``,
      so that a variant is within the tolerance t of FP32 (1.0) only when its cosine is at
      least 1 - t and its recall@10 at least 1 - 3t (0.99 and 0.97 at the default 0.01).
    """
    got, ref = _sentence_vectors(outputs, data), _sentence_vectors(reference, data)
    if len(ref) <= RECALL_K:
        raise ConfigError(f"metric 'embedding' needs more than {RECALL_K} EVAL rows (its recall@{RECALL_K})")
    k = RECALL_K
    cosine = float(np.mean(np.sum(got * ref, axis=1)))
    found, truth = _neighbours(got, ref, k), _neighbours(ref, ref, k)
    recall = float(
        np.mean([len(set(a) & set(b)) / k for a, b in zip(found.tolist(), truth.tolist(), strict=True)])
    )
    quality = min(cosine, 1.0 - (1.0 - recall) / RECALL_SLACK)
    return {"cosine": cosine, "recall_at_10": recall, "quality": quality}


@dataclass
class Timing:
    batches: tuple[int, ...] = BATCHES
    # batch -> one list of call durations (seconds) per interleaved round
    rounds: dict[int, list[list[float]]] = field(default_factory=dict)
    rss_mb: float = 0.0

    def __post_init__(self) -> None:
        self.rounds = {b: [] for b in self.batches}

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {"rss_mb": round(self.rss_mb, 1)}
        for b, rounds in self.rounds.items():
            s = [x for r in rounds for x in r]
            if s:
                p50, p99 = percentiles(s, [50, 99])
                out[f"p50_b{b}_us"] = p50 * 1e6
                out[f"p99_b{b}_us"] = p99 * 1e6
                out[f"throughput_b{b}"] = b / p50
                out[f"calls_b{b}"] = float(len(s))
        return out


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    except OSError:
        return 0.0


def measure_rounds(
    paths: dict[str, Path | ModelRef],
    data: EvalSet,
    threads: int = 1,
    rounds: int = 5,
    seconds_per_round: float = 0.2,
    batches: tuple[int, ...] = BATCHES,
    min_calls: int = 3,
    advance: Any = None,
) -> dict[str, Timing]:
    """Latency per variant and batch size, interleaved round-robin (A B C A B C ...) with
    the thread count pinned; each (round, variant, batch) gets its time share and at least
    ``min_calls``. The samples stay grouped by round, for paired bootstrap intervals."""
    sessions, timings = {}, {}
    for name, path in paths.items():
        before = _rss_mb()
        sessions[name] = _runner(path, threads)
        timings[name] = Timing(batches)
        feeds = {k: v[:1] for k, v in data.inputs.items()}
        sessions[name].run(None, feeds)
        timings[name].rss_mb = _rss_mb() - before
    feeds_by_batch = {
        b: {k: np.resize(v, (b, *v.shape[1:])) for k, v in data.inputs.items()} for b in batches
    }
    for _ in range(rounds):
        for name, sess in sessions.items():
            for b, feeds in feeds_by_batch.items():
                deadline = time.perf_counter() + seconds_per_round / len(batches)
                sess.run(None, feeds)  # the first call after switching models is not timed
                calls: list[float] = []
                while len(calls) < min_calls or time.perf_counter() < deadline:
                    t0 = time.perf_counter()
                    sess.run(None, feeds)
                    calls.append(time.perf_counter() - t0)
                timings[name].rounds[b].append(calls)
        if advance is not None:
            advance(1)
    return timings
