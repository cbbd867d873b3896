"""The gRPC floor: grpcio's synchronous server with one generic handler for the OIP service,
running the model through ONNX Runtime in each ModelInfer, and nothing else (no batching,
no metrics, no limits). What a Python gRPC front end reaches with grpcio's C core doing
the HTTP/2; kept beside milliserve's gRPC port in ``benchmarks/server_overhead.py``.

    python benchmarks/apps/grpc_floor.py MODEL.onnx PORT

Answers ServerLive/Ready, ServerMetadata, ModelReady, ModelMetadata and ModelConfig (what
perf_analyzer asks before it measures) and ModelInfer on raw tensor contents.
"""

from __future__ import annotations

import sys
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort

from milliserve.protocol.proto import oip_pb2 as pb

_SERVICE = "inference.GRPCInferenceService"
_TYPES = {"tensor(float)": ("FP32", np.float32), "tensor(int64)": ("INT64", np.int64)}


def main(model: str, port: int) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    ins, outs = session.get_inputs(), session.get_outputs()
    dtypes = {t.name: _TYPES[t.type][1] for t in ins}
    out_type = _TYPES[outs[0].type][0]
    name = "fraud_mlp"

    def dims(t: ort.NodeArg) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in t.shape]

    metadata = pb.ModelMetadataResponse(name=name, versions=["1"], platform="onnxruntime_onnx")
    for t in ins:
        metadata.inputs.add(name=t.name, datatype=_TYPES[t.type][0], shape=dims(t))
    for t in outs:
        metadata.outputs.add(name=t.name, datatype=_TYPES[t.type][0], shape=dims(t))
    config = pb.ModelConfigResponse()
    config.config.name, config.config.platform, config.config.max_batch_size = name, "onnxruntime_onnx", 64
    for t in ins:
        config.config.input.add(name=t.name, data_type=f"TYPE_{_TYPES[t.type][0]}", dims=dims(t)[1:])
    for t in outs:
        config.config.output.add(name=t.name, data_type=f"TYPE_{_TYPES[t.type][0]}", dims=dims(t)[1:])

    def infer(request: Any, context: Any) -> Any:
        feeds = {
            t.name: np.frombuffer(raw, dtypes[t.name]).reshape(tuple(t.shape))
            for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
        }
        y = session.run(None, feeds)[0]
        response = pb.ModelInferResponse(model_name=name, model_version="1", id=request.id)
        response.outputs.add(name=outs[0].name, datatype=out_type, shape=list(y.shape))
        response.raw_output_contents.append(y.tobytes())
        return response

    def constant(answer: Any) -> Any:
        return lambda request, context: answer

    def unary(fn: Any, request_type: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=request_type.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )

    handlers = {
        "ServerLive": unary(constant(pb.ServerLiveResponse(live=True)), pb.ServerLiveRequest),
        "ServerReady": unary(constant(pb.ServerReadyResponse(ready=True)), pb.ServerReadyRequest),
        "ModelReady": unary(constant(pb.ModelReadyResponse(ready=True)), pb.ModelReadyRequest),
        "ServerMetadata": unary(
            constant(pb.ServerMetadataResponse(name="floor", version="0")), pb.ServerMetadataRequest
        ),
        "ModelMetadata": unary(constant(metadata), pb.ModelMetadataRequest),
        "ModelConfig": unary(constant(config), pb.ModelConfigRequest),
        "ModelInfer": unary(infer, pb.ModelInferRequest),
    }
    # one worker thread: the model runs on one thread, as on the HTTP floor; more threads
    # would only contend for the GIL on these 2 vCPUs
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), maximum_concurrent_rpcs=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
