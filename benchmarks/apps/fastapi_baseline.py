"""The minimal baseline users compare against: plain FastAPI + uvicorn serving the same
ONNX model, no batching, no metrics, the inference called inline.

    python benchmarks/apps/fastapi_baseline.py MODEL.onnx PORT
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], options)
app = FastAPI()


class Tensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    data: list[float]


class Request(BaseModel):
    inputs: list[Tensor]


@app.post("/v2/models/fraud_mlp/infer")
async def infer(request: Request) -> dict[str, object]:
    t = request.inputs[0]
    x = np.asarray(t.data, dtype=np.float32).reshape(t.shape)
    y = session.run(None, {t.name: x})[0]
    return {
        "model_name": "fraud_mlp",
        "outputs": [
            {
                "name": "probabilities",
                "datatype": "FP32",
                "shape": list(y.shape),
                "data": y.reshape(-1).tolist(),
            }
        ],
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
