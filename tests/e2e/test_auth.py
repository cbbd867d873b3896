"""Optional token authentication on a real server, with Triton's clients: inference,
metadata and repository calls need the token (bearer or x-api-key, HTTP headers or gRPC
metadata); health and metrics stay open; 404s name no other model and the repository
index no absolute path."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

TOKEN = "s3cret-token"


def _input(module: object) -> object:
    inp = module.InferInput("features", [1, 64], "FP32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    return inp


def test_token_required_on_the_api_and_not_on_health(example_repo: Path) -> None:
    env = {**os.environ, "MILLISERVE_AUTH__TOKEN": TOKEN}  # the env var; --auth-token does the same
    with ServerProcess(
        example_repo, "--model-control-mode", "explicit", "--load-model", "fraud_mlp", env=env
    ) as srv:
        base = f"http://{srv.http_url}"
        with httpx.Client(base_url=base) as c:
            assert c.get("/v2/health/live").status_code == 200
            assert c.get("/v2/health/ready").status_code == 200
            assert c.get("/metrics").status_code == 200  # Prometheus needs no token
            assert httpx.get(srv.metrics_url).status_code == 200
            denied = c.get("/v2/models/fraud_mlp")
            assert denied.status_code == 401 and "requires a token" in denied.json()["error"]
            assert denied.headers["www-authenticate"].startswith("Bearer")
            wrong = c.get("/v2/models/fraud_mlp", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]
            assert c.post("/v2/repository/index").status_code == 401
            for headers in ({"Authorization": f"Bearer {TOKEN}"}, {"x-api-key": TOKEN}):
                assert c.get("/v2/models/fraud_mlp", headers=headers).status_code == 200
            # with the token: a 404 does not list the repository, the index shows no absolute path
            missing = c.get("/v2/models/nope", headers={"x-api-key": TOKEN})
            assert missing.status_code == 404 and "fraud_mlp" not in missing.text
            index = c.post("/v2/repository/index", headers={"x-api-key": TOKEN}).text
            assert str(example_repo) not in index and "fraud_mlp" in index

        with httpclient.InferenceServerClient(srv.http_url) as h:
            with pytest.raises(InferenceServerException, match="requires a token"):
                h.infer("fraud_mlp", [_input(httpclient)])
            result = h.infer("fraud_mlp", [_input(httpclient)], headers={"Authorization": f"Bearer {TOKEN}"})
            assert result.as_numpy("probabilities").shape == (1, 2)

        with grpcclient.InferenceServerClient(srv.grpc_url) as g:
            assert g.is_server_live() and g.is_server_ready()  # health stays open
            with pytest.raises(InferenceServerException) as err:
                g.infer("fraud_mlp", [_input(grpcclient)])
            assert "UNAUTHENTICATED" in str(err.value.status())
            result = g.infer("fraud_mlp", [_input(grpcclient)], headers={"x-api-key": TOKEN})
            assert result.as_numpy("probabilities").shape == (1, 2)
            assert g.get_model_metadata("fraud_mlp", headers={"authorization": f"Bearer {TOKEN}"}).name


def test_closed_health_needs_the_token_too(example_repo: Path) -> None:
    env = {**os.environ, "MILLISERVE_AUTH__PROTECT_HEALTH": "true"}
    args = ("--auth-token", TOKEN, "--model-control-mode", "explicit")
    with ServerProcess(example_repo, *args, env=env, headers={"x-api-key": TOKEN}) as srv:
        assert httpx.get(f"http://{srv.http_url}/v2/health/ready").status_code == 401
        assert httpx.get(srv.metrics_url).status_code == 200  # metrics stay open unless closed too
