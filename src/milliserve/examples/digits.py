"""A small PyTorch CNN on scikit-learn's bundled 8x8 digits: a fast, real model for
``milliserve optimize`` with a PyTorch source (export, pruning, distillation).

    milliserve optimize milliserve.examples.digits:factory --eval eval.npz ...

``write_data(DIR)`` writes the eval, calibration and training sets as .npz files.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["digits_cnn", "digits_data", "factory", "small_student", "write_data"]


def digits_data() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Images as float32 [n, 1, 8, 8] in 0..1, and labels 0-9, in a fixed shuffled order."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    order = np.random.default_rng(0).permutation(len(x))
    return x[order], d.target[order].astype(np.int64)


def digits_cnn(width: int = 16) -> Any:
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(2 * width * 64, 4 * width),
        nn.ReLU(),
        nn.Linear(4 * width, 10),
    )


def small_student() -> Any:
    """A narrower CNN, for distillation with ``--student milliserve.examples.digits:small_student``."""
    return digits_cnn(width=4)


@cache
def _trained_state() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x, y = digits_data()
    xt, yt = torch.from_numpy(x[:1400]), torch.from_numpy(y[:1400])
    model = digits_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(12):
        for i in range(0, len(xt), 64):
            loss = F.cross_entropy(model(xt[i : i + 64]), yt[i : i + 64])
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def factory() -> tuple[Any, Any]:
    """The trained CNN and an example input (the ``package.module:factory`` source form)."""
    import torch

    model = digits_cnn()
    model.load_state_dict(_trained_state())
    return model.eval(), torch.from_numpy(digits_data()[0][:2])


def write_data(directory: Path) -> dict[str, Path]:
    """train.npz (first 1400 rows), eval.npz (the other 397) and calib.npz (256 training rows)."""
    directory.mkdir(parents=True, exist_ok=True)
    x, y = digits_data()
    paths = {name: directory / f"{name}.npz" for name in ("train", "eval", "calib")}
    np.savez(paths["train"], input=x[:1400], labels=y[:1400])
    np.savez(paths["eval"], input=x[1400:], labels=y[1400:])
    np.savez(paths["calib"], input=x[:256])
    return paths
