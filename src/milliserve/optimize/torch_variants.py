"""Variants that change a PyTorch model before export: magnitude and structured pruning,
and knowledge distillation into a smaller student (Hinton et al. 2015: the teacher's
temperature-softened distribution through KL, plus the hard labels, weighted by alpha).

Each returns a new module; the caller exports it and quantizes it like any other variant.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from milliserve.optimize.measure import EvalSet
from milliserve.optimize.progress import Progress, quiet

__all__ = [
    "TrainConfig",
    "distill",
    "layer_stack",
    "magnitude_prune",
    "sparsity",
    "structured_prune",
    "student_from_layers",
]

log = logging.getLogger(__name__)
ELEMENTWISE = ("ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "Dropout", "MaxPool2d", "AvgPool2d", "Identity")


class CannotApply(Exception):
    """The transformation does not fit this model; the message says why (reported as skipped)."""


@dataclass
class TrainConfig:
    epochs: int = 2
    batch_size: int = 32
    lr: float = 1e-4
    temperature: float = 2.0
    alpha: float = 0.5  # weight of the softened teacher (KL); 1 - alpha on the hard labels
    seed: int = 0


def _prunable(module: Any) -> list[Any]:
    import torch.nn as nn

    return [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]


def sparsity(module: Any) -> float:
    """Fraction of zero weights over the Linear and Conv layers."""
    ws = [m.weight.detach() for m in _prunable(module)]
    total = sum(w.numel() for w in ws)
    return float(sum((w == 0).sum().item() for w in ws) / max(total, 1))


def magnitude_prune(module: Any, amount: float) -> Any:
    """A copy with the smallest ``amount`` of Linear/Conv weights (global L1) set to zero.
    The pruning masks stay attached (call ``finish_pruning`` after fine-tuning)."""
    import torch.nn.utils.prune as prune

    m = copy.deepcopy(module)
    params = [(layer, "weight") for layer in _prunable(m)]
    if not params:
        raise CannotApply("no Linear or Conv layers to prune")
    prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=amount)
    return m


def finish_pruning(module: Any) -> Any:
    """Make the pruning masks permanent (the zeros become plain weights)."""
    import torch.nn.utils.prune as prune

    for layer in _prunable(module):
        if prune.is_pruned(layer):
            prune.remove(layer, "weight")  # type: ignore[no-untyped-call]
    return module


def _keep(scores: Any, amount: float) -> Any:
    import torch

    n = len(scores)
    k = max(1, round(n * (1 - amount)))
    return torch.sort(torch.topk(scores, k).indices).values


def _slice_linear(layer: Any, rows: Any = None, cols: Any = None) -> None:
    import torch.nn as nn

    w = layer.weight.data
    if rows is not None:
        w = w[rows]
        if layer.bias is not None:
            layer.bias = nn.Parameter(layer.bias.data[rows].clone())
        layer.out_features = len(rows)
    if cols is not None:
        w = w[:, cols]
        layer.in_features = len(cols)
    layer.weight = nn.Parameter(w.clone())


def _bert_layers(module: Any) -> list[Any]:
    return [
        m
        for m in module.modules()
        if hasattr(m, "intermediate") and hasattr(m, "attention") and hasattr(m, "output")
    ]


def _prune_bert(module: Any, amount: float) -> str:
    """Drop FFN channels and attention heads of every encoder layer, by weight norm."""
    import torch

    heads_total = heads_kept = ffn_total = ffn_kept = 0
    for layer in _bert_layers(module):
        inter, out = layer.intermediate.dense, layer.output.dense
        score = inter.weight.norm(dim=1) * out.weight.norm(dim=0)
        keep = _keep(score, amount)
        ffn_total, ffn_kept = ffn_total + inter.out_features, ffn_kept + len(keep)
        _slice_linear(inter, rows=keep)
        _slice_linear(out, cols=keep)
        att = layer.attention.self
        size = att.attention_head_size
        n_heads = att.query.out_features // size
        proj = layer.attention.output.dense
        head_score = proj.weight.detach().reshape(proj.out_features, n_heads, size).norm(dim=(0, 2))
        heads = _keep(head_score, amount)
        idx = torch.cat([torch.arange(h * size, (h + 1) * size) for h in heads.tolist()])
        for lin in (att.query, att.key, att.value):
            _slice_linear(lin, rows=idx)
        _slice_linear(proj, cols=idx)
        att.num_attention_heads = len(heads)
        att.all_head_size = len(idx)
        heads_total, heads_kept = heads_total + n_heads, heads_kept + len(heads)
    return f"kept {heads_kept}/{heads_total} attention heads and {ffn_kept}/{ffn_total} FFN channels"


def _pairs(module: Any) -> Iterator[tuple[Any, list[Any], Any]]:
    """(producer, layers between, consumer) inside every nn.Sequential, where only
    elementwise layers (or a Flatten before a Linear) sit between."""
    import torch.nn as nn

    for seq in module.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        layers = list(seq)
        for i, a in enumerate(layers):
            if not isinstance(a, (nn.Linear, nn.Conv2d)):
                continue
            between: list[Any] = []
            for b in layers[i + 1 :]:
                if isinstance(b, (nn.Linear, nn.Conv2d)):
                    flat = any(isinstance(x, nn.Flatten) for x in between)
                    if isinstance(a, nn.Linear) == isinstance(b, nn.Linear) or (
                        isinstance(b, nn.Linear) and flat
                    ):
                        yield a, between, b
                    break
                if type(b).__name__ in ELEMENTWISE or isinstance(
                    b, (nn.Flatten, nn.BatchNorm2d, nn.BatchNorm1d)
                ):
                    between.append(b)
                    continue
                break


def _prune_pairs(module: Any, amount: float) -> str:
    import torch
    import torch.nn as nn

    total = kept = 0
    for a, between, b in list(_pairs(module)):
        score = a.weight.detach().reshape(a.weight.shape[0], -1).norm(dim=1)
        keep = _keep(score, amount)
        n = a.weight.shape[0]
        if isinstance(a, nn.Linear):
            _slice_linear(a, rows=keep)
        else:
            a.weight = nn.Parameter(a.weight.data[keep].clone())
            if a.bias is not None:
                a.bias = nn.Parameter(a.bias.data[keep].clone())
            a.out_channels = len(keep)
        for bn in between:
            if isinstance(bn, (nn.BatchNorm1d, nn.BatchNorm2d)):
                bn.weight = nn.Parameter(bn.weight.data[keep].clone())
                bn.bias = nn.Parameter(bn.bias.data[keep].clone())
                bn.running_mean = bn.running_mean[keep].clone()  # type: ignore[index]
                bn.running_var = bn.running_var[keep].clone()  # type: ignore[index]
                bn.num_features = len(keep)
        if isinstance(b, nn.Linear):
            per = b.in_features // n  # a Flatten after a Conv: each channel owns `per` columns
            cols = torch.cat([torch.arange(c * per, (c + 1) * per) for c in keep.tolist()])
            _slice_linear(b, cols=cols)
        else:
            b.weight = nn.Parameter(b.weight.data[:, keep].clone())
            b.in_channels = len(keep)
        total, kept = total + n, kept + len(keep)
    if not total:
        raise CannotApply(
            "no structure to prune: milliserve prunes BERT-like encoders (heads and FFN channels) "
            "and Linear/Conv pairs inside nn.Sequential"
        )
    return f"kept {kept}/{total} hidden channels"


def structured_prune(module: Any, amount: float) -> tuple[Any, str]:
    """A copy with ``amount`` of the channels (or attention heads and FFN channels) removed."""
    m = copy.deepcopy(module)
    if _bert_layers(m):
        return m, _prune_bert(m, amount)
    return m, _prune_pairs(m, amount)


def layer_stack(module: Any) -> tuple[Any, str] | None:
    """The transformer's list of layers (``encoder.layer`` or ``layers``), if it has one."""
    import torch.nn as nn

    for name, m in module.named_modules():
        for attr in ("layer", "layers"):
            stack = getattr(m, attr, None)
            if isinstance(stack, nn.ModuleList) and len(stack) > 1:
                return m, f"{name}.{attr}" if name else attr
    return None


def student_from_layers(teacher: Any, n_layers: int) -> tuple[Any, str]:
    """A copy of the teacher keeping ``n_layers`` evenly spaced layers of its stack."""
    import torch.nn as nn

    m = copy.deepcopy(teacher)
    found = layer_stack(m)
    if found is None:
        raise CannotApply("the teacher has no layer stack to shrink; give a student architecture instead")
    owner, where = found
    attr = where.rsplit(".", 1)[-1]
    stack = getattr(owner, attr)
    n = len(stack)
    if not 1 <= n_layers < n:
        raise CannotApply(
            f"a student needs between 1 and {n - 1} of the teacher's {n} layers, not {n_layers}"
        )
    keep = sorted({round(i * (n - 1) / max(n_layers - 1, 1)) for i in range(n_layers)})
    setattr(owner, attr, nn.ModuleList([stack[i] for i in keep]))
    for cfg in (getattr(m, "config", None), getattr(owner, "config", None)):
        if cfg is not None and hasattr(cfg, "num_hidden_layers"):
            cfg.num_hidden_layers = len(keep)
    return m, f"layers {keep} of the teacher's {n} ({where})"


def _batches(data: EvalSet, size: int, rng: np.random.Generator) -> Iterator[tuple[dict[str, Any], Any]]:
    order = rng.permutation(data.rows)
    for start in range(0, data.rows, size):
        idx = order[start : start + size]
        feeds = {k: v[idx] for k, v in data.inputs.items()}
        mask = feeds.get("attention_mask")
        if mask is not None and mask.ndim == 2:  # drop the padding columns no row in the batch uses
            width = max(1, int(mask.sum(1).max()))
            feeds = {
                k: v[:, :width] if v.ndim == 2 and not np.issubdtype(v.dtype, np.floating) else v
                for k, v in feeds.items()
            }
        yield feeds, idx


def _forward(module: Any, feeds: dict[str, Any]) -> Any:
    import torch

    out = module(*(torch.from_numpy(np.ascontiguousarray(v)) for v in feeds.values()))
    if isinstance(out, (tuple, list)):
        out = out[0]
    elif isinstance(out, dict):
        out = next(iter(out.values()))
    return out


def distill(
    student: Any,
    teacher: Any,
    train: EvalSet,
    cfg: TrainConfig | None = None,
    progress: Progress = quiet,
    label: str = "distilling",
) -> Any:
    """Train ``student`` on ``train`` against ``teacher``: KL on temperature-softened outputs
    (times T²) weighted by alpha, plus cross-entropy on the labels weighted by 1 - alpha.
    Without labels (an embedding model) the loss is the MSE to the teacher's outputs."""
    import torch
    import torch.nn.functional as F

    cfg = cfg or TrainConfig()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    teacher.eval()
    with torch.no_grad():  # not inference_mode: the targets take part in the loss's graph
        targets = torch.cat([_forward(teacher, feeds) for feeds, _ in _ordered(train, 256)]).clone()
    labels = torch.from_numpy(train.labels.astype(np.int64)) if train.labels is not None else None
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    steps = cfg.epochs * -(-train.rows // cfg.batch_size)
    student.train()
    t = cfg.temperature
    with progress.steps(label, steps) as advance:
        for _ in range(cfg.epochs):
            for feeds, idx in _batches(train, cfg.batch_size, rng):
                out = _forward(student, feeds)
                target = targets[idx]
                if labels is None:
                    loss = F.mse_loss(out, target)
                else:
                    soft = F.kl_div(
                        F.log_softmax(out / t, -1),
                        F.log_softmax(target / t, -1),
                        reduction="batchmean",
                        log_target=True,
                    )
                    loss = cfg.alpha * t * t * soft + (1 - cfg.alpha) * F.cross_entropy(out, labels[idx])
                opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
                advance(1)
    student.eval()
    return student


def _ordered(data: EvalSet, size: int) -> Iterator[tuple[dict[str, Any], Any]]:
    for start in range(0, data.rows, size):
        idx = np.arange(start, min(start + size, data.rows))
        yield {k: v[idx] for k, v in data.inputs.items()}, idx
