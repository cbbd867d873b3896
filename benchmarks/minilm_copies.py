"""Copies of the example MiniLM under different configs in one repository, and one
`milliserve bench` run against one of them: shared by adaptive_batching.py and overload.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from report_sections import bench_level

from milliserve.examples.minilm import build_minilm

SEQ = 32
CONFIG = """\
name: {name}
backend: onnxruntime
max_batch_size: 32
input:
  - {{name: input_ids, data_type: TYPE_INT64, dims: [-1]}}
  - {{name: attention_mask, data_type: TYPE_INT64, dims: [-1]}}
output:
  - {{name: embedding, data_type: TYPE_FP32, dims: [384]}}
dynamic_batching:
  preferred_batch_size: [8, 16, 32]
{batching}
  default_queue_policy: {{max_queue_size: 1024}}
parameters: {{intra_op_thread_count: "2"}}
{extra}"""


def build_copies(repo: Path, copies: dict[str, tuple[str, str]]) -> None:
    """``copies``: model name -> (lines inside dynamic_batching, top-level YAML)."""
    build_minilm(repo)
    src = repo / "minilm" / "1" / "model.onnx"
    for name, (batching, extra) in copies.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(src, repo / name / "1" / "model.onnx")
        (repo / name / "config.yaml").write_text(CONFIG.format(name=name, batching=batching, extra=extra))
    shutil.rmtree(repo / "minilm")


def bench(url: str, model: str, out: Path, *load: str, seconds: float) -> dict[str, Any]:
    """One `milliserve bench` level (``load``: --rate R or --concurrency C), zero-filled
    inputs of SEQ tokens, 2 s warm-up; returns its JSON level."""
    shapes = ("--shape", f"input_ids:{SEQ}", "--shape", f"attention_mask:{SEQ}", "--data", "zero")
    return bench_level(url, model, out, *load, *shapes, seconds=seconds, warmup=2)
