"""Triton itself as a peer: NVIDIA's tritonserver 2.51 (C++ HTTP/gRPC front end and dynamic
batcher) through nvidia-pytriton 0.7.0, with fraud_mlp in ONNX Runtime inside the Python
callable (PyTriton ships no C++ onnxruntime backend). Run in its own venv:

    python pytriton_fraud.py MODEL.onnx --http-port P --grpc-port Q --metrics-port R [--no-batcher]

The interpreter's own libpython must come first on LD_LIBRARY_PATH (shared/TRITON-PEER-NOTES.md);
benchmarks/grpc_road.py starts it that way.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--no-batcher", action="store_true")
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    session = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])

    @batch
    def infer(features: np.ndarray) -> dict[str, np.ndarray]:
        (out,) = session.run(None, {"features": features})
        return {"probabilities": out}

    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        metrics_address="127.0.0.1",
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
    )
    batcher = (
        None
        if args.no_batcher
        else DynamicBatcher(max_queue_delay_microseconds=200, preferred_batch_size=[8, 16])
    )
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        triton.bind(
            model_name="fraud_mlp",
            infer_func=infer,
            inputs=[Tensor(name="features", dtype=np.float32, shape=(64,))],
            outputs=[Tensor(name="probabilities", dtype=np.float32, shape=(2,))],
            config=ModelConfig(batching=True, max_batch_size=64, batcher=batcher),
        )
        triton.serve()


if __name__ == "__main__":
    main()
