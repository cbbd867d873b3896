"""The embeddings peer users write themselves: sentence-transformers behind FastAPI +
uvicorn, an OpenAI-style ``POST /v1/embeddings`` that encodes each request's texts in one
``model.encode`` call (no batching across requests), on CPU.

    python benchmarks/apps/st_embeddings.py MODEL_DIR PORT [THREADS] [BACKEND]

BACKEND: ``torch`` (default: eager PyTorch, THREADS torch threads) or ``onnx``
(sentence-transformers' own ONNX Runtime backend, its documented CPU speed-up; MODEL_DIR is
then a local ONNX export holding ``model.onnx``, loaded offline).
"""

from __future__ import annotations

import base64
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
backend = sys.argv[4] if len(sys.argv) > 4 else "torch"
if backend == "onnx":
    model = SentenceTransformer(
        sys.argv[1],
        device="cpu",
        backend="onnx",
        model_kwargs={"file_name": "model.onnx", "provider": "CPUExecutionProvider"},
    )
else:
    model = SentenceTransformer(sys.argv[1], device="cpu")
app = FastAPI()


class Request(BaseModel):
    model: str
    input: str | list[str]
    encoding_format: str = "float"


@app.post("/v1/embeddings")
async def embeddings(request: Request) -> dict[str, object]:
    texts = [request.input] if isinstance(request.input, str) else request.input
    vectors = await run_in_threadpool(
        model.encode, texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True
    )
    if request.encoding_format == "base64":
        data: list[object] = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    else:
        data = [v.tolist() for v in vectors]
    tokens = 0  # not counted: a second tokenization would cost the peer time
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[2]),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
