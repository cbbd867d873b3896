"""The default JSON body limit (issue 24, item 5): decoding JSON holds the interpreter in
one call, even off the event loop, so a JSON body is kept to what decodes in a few
milliseconds (2 MiB); a larger one is refused before it is read, with a 413 that names
the binary tensor extension, which carries the same tensors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from milliserve.config.settings import HttpSettings
from milliserve.testing import InProcessServer

MiB = 1 << 20


def test_the_default_json_limit_is_a_few_milliseconds_of_decoding() -> None:
    assert HttpSettings().max_json_bytes == 2 * MiB


def test_a_json_body_over_the_limit_is_refused_with_the_binary_extension_named(
    tmp_path: Path, write_add_sub: Callable[..., Path], run: Any
) -> None:
    write_add_sub(tmp_path)
    a = np.linspace(0, 1, 120_000, dtype=np.float32).reshape(1, -1)
    b = np.full_like(a, 0.25)
    inputs = [
        {"name": n, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        for n, x in (("INPUT0", a), ("INPUT1", b))
    ]
    body = orjson.dumps({"inputs": inputs})
    assert 2 * MiB < len(body) < 16 * MiB  # refused now, decoded before

    async def main() -> None:
        async with InProcessServer(tmp_path, listen=False, max_request_bytes=32 * MiB) as server:
            transport = httpx.ASGITransport(app=server.http_app())
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                r = await c.post("/v2/models/add_sub/infer", content=body)
                assert r.status_code == 413, r.text[:300]
                message = r.json()["error"]
                assert "binary tensor extension" in message and str(2 * MiB) in message
                # the same tensors in the binary extension
                header = orjson.dumps(
                    {
                        "inputs": [
                            {
                                "name": n,
                                "shape": list(x.shape),
                                "datatype": "FP32",
                                "parameters": {"binary_data_size": x.nbytes},
                            }
                            for n, x in (("INPUT0", a), ("INPUT1", b))
                        ],
                        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
                    }
                )
                r = await c.post(
                    "/v2/models/add_sub/infer",
                    content=header + a.tobytes() + b.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(header))},
                )
                assert r.status_code == 200, r.text[:300]
                n = int(r.headers["inference-header-content-length"])
                got = np.frombuffer(r.content[n:], np.float32).reshape(a.shape)
                np.testing.assert_allclose(got, a + b)

    run(main())
