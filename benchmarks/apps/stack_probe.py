"""One OIP infer route on three HTTP stacks, to choose milliserve's by measuring it.
Each calls ONNX Runtime inline (no batching, no metrics), so only the stack differs.

    python benchmarks/apps/stack_probe.py STACK MODEL.onnx PORT
    STACK: raw-uvicorn | starlette-uvicorn | raw-granian
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(sys.argv[2], options)


def answer(body: bytes) -> bytes:
    doc = orjson.loads(body)
    t = doc["inputs"][0]
    x = np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])
    y = session.run(None, {t["name"]: x})[0]
    out = {
        "model_name": "fraud_mlp",
        "outputs": [
            {"name": "probabilities", "datatype": "FP32", "shape": list(y.shape), "data": y.reshape(-1)}
        ],
    }
    return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)


async def raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    body = answer(b"".join(chunks))
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def infer(request: Request) -> Response:
        return Response(answer(await request.body()), media_type="application/json")

    return Starlette(routes=[Route("/v2/models/fraud_mlp/infer", infer, methods=["POST"])])


if __name__ == "__main__":
    stack, port = sys.argv[1], int(sys.argv[3])
    if stack == "raw-granian":
        from granian import Granian
        from granian.constants import Interfaces, Loops

        Granian(
            "stack_probe:raw_app",
            address="127.0.0.1",
            port=port,
            interface=Interfaces.ASGI,
            loop=Loops.uvloop,
            workers=1,
            log_enabled=False,
        ).serve()
    else:
        import uvicorn

        app = raw_app if stack == "raw-uvicorn" else starlette_app()
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level="warning",
        )
