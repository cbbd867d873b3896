"""fraud_mlp on BentoML, OIP-shaped route (settings and why: peer_settings.py).
MODEL=... MAX_BATCH=... MAX_LATENCY_MS=... [WORKERS=...] \
    bentoml serve bentoml_app:Fraud --port PORT --host 127.0.0.1"""

import os

import bentoml
import numpy as np
import onnxruntime as ort

BATCH = int(os.environ.get("MAX_BATCH", "1"))
MAX_LATENCY_MS = int(os.environ.get("MAX_LATENCY_MS", "2"))
ROUTE = "/v2/models/fraud_mlp/infer"


# no line logged per request, as every server here
@bentoml.service(workers=int(os.environ.get("WORKERS", "1")), logging={"access": {"enabled": False}})
class Fraud:
    def __init__(self) -> None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.session = ort.InferenceSession(os.environ["MODEL"], so)

    @(
        bentoml.api(route=ROUTE, batchable=True, max_batch_size=BATCH, max_latency_ms=MAX_LATENCY_MS)
        if BATCH > 1
        else bentoml.api(route=ROUTE)
    )
    def infer(self, inputs: list[dict]) -> list[dict]:
        x = np.concatenate([np.asarray(t["data"], np.float32).reshape(t["shape"]) for t in inputs])
        y = self.session.run(None, {"features": x})[0]
        return [
            {"name": "probabilities", "datatype": "FP32", "shape": [1, 2], "data": row.tolist()} for row in y
        ]
