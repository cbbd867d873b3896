"""fastembed behind FastAPI + uvicorn: an OpenAI-style ``POST /v1/embeddings`` that embeds
each request's texts with one ``TextEmbedding.embed`` call (ONNX Runtime; no batching
across requests). The model is a local ONNX export of all-MiniLM-L6-v2, loaded offline as a
custom model (mean pooling, L2 normalised), so nothing is downloaded. Runs in its own venv
(benchmarks/embeddings.py builds it, pinned in benchmarks/peers/peer_settings.py).

    python benchmarks/apps/fastembed_embeddings.py ONNX_DIR PORT [THREADS]

THREADS: ONNX Runtime's threads; absent or 0, fastembed's default (ONNX Runtime's own:
one per core), which its docs leave as the default for a single process.
"""

from __future__ import annotations

import base64
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import uvicorn
from fastapi import FastAPI
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType
from pydantic import BaseModel

NAME = "local/all-MiniLM-L6-v2-onnx"
TextEmbedding.add_custom_model(
    model=NAME,
    pooling=PoolingType.MEAN,
    normalization=True,
    sources=ModelSource(hf=NAME),
    dim=384,
    model_file="model.onnx",
)
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 0
model = TextEmbedding(model_name=NAME, specific_model_path=sys.argv[1], threads=threads or None)
app = FastAPI()


class Request(BaseModel):
    model: str
    input: str | list[str]
    encoding_format: str = "float"


@app.post("/v1/embeddings")
def embeddings(request: Request) -> dict[str, object]:
    # a plain (sync) route: FastAPI runs it in its thread pool, as a user would write it
    texts = [request.input] if isinstance(request.input, str) else request.input
    vectors = list(model.embed(texts, batch_size=32))
    if request.encoding_format == "base64":
        data: list[object] = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    else:
        data = [v.tolist() for v in vectors]
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
        "model": request.model,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
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
