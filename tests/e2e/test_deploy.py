"""The packaging for Kubernetes, checked as far as it can be without a cluster or a Docker
engine (neither runs here):

- deploy/kubernetes/milliserve.yaml against the Kubernetes API's JSON schemas (strict: an
  unknown field fails), from ``kubernetes-validate``;
- deploy/kserve/*.yaml against KServe's API types (the generated models in the ``kserve``
  wheel, read without importing it: every field known, required fields present, types
  right), with their Kubernetes parts (containers) against the Kubernetes schemas;
- the Dockerfile's command, environment and health check run as the container would run
  them (only the bind address and ports changed), and SIGTERM drained within the pod's
  grace period. Not as the image's user 10001: this machine's Python lives under /root,
  which that user cannot read; the Dockerfile's user is checked to be non-root instead.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from milliserve.testing import free_port, wait_until
from tests.support.probes import pending_requests, post_status, slow_body

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _deployment() -> dict[str, Any]:
    return next(d for d in _docs(ROOT / "deploy/kubernetes/milliserve.yaml") if d["kind"] == "Deployment")


# ---- Kubernetes ----


def test_the_plain_manifests_are_valid_kubernetes_objects() -> None:
    import kubernetes_validate

    kinds = []
    for doc in _docs(ROOT / "deploy/kubernetes/milliserve.yaml"):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        kinds.append(doc["kind"])
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler"]


def test_the_deployment_matches_the_server() -> None:
    """Ports, probes and environment name things the server really has."""
    from milliserve.config.settings import Settings

    pod = _deployment()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    env = {e["name"]: e["value"] for e in container["env"]}
    settings = Settings(**_settings_from_env(env))
    assert settings.workers == 2 and settings.host == "0.0.0.0" and settings.cpu_affinity == "off"
    # drain (after the preStop pause) ends before the kubelet's SIGKILL
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pause + settings.shutdown_grace_s < pod["terminationGracePeriodSeconds"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0


def _settings_from_env(env: dict[str, str]) -> dict[str, Any]:
    """MILLISERVE_* variables as Settings keyword arguments (so a misspelt one fails)."""
    out: dict[str, Any] = {}
    for name, value in env.items():
        assert name.startswith("MILLISERVE_"), name
        path = name.removeprefix("MILLISERVE_").lower().split("__")
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


# ---- KServe ----


def _kserve_models() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("kserve")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the kserve wheel is not installed (scripts/test installs it with --no-deps)")
    return Path(next(iter(spec.submodule_search_locations))) / "models"


@cache
def _kserve_types() -> dict[str, tuple[dict[str, str], dict[str, str], set[str]]]:
    """KServe's API types from its generated models: class -> (field -> type, field ->
    JSON key, required fields). Read with ast: importing kserve pulls in its server."""
    types = {}
    for path in _kserve_models().glob("v1*.py"):
        source = path.read_text()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef):
                continue
            found: dict[str, Any] = {}
            for item in node.body:
                target = item.targets[0] if isinstance(item, ast.Assign) else None
                if isinstance(target, ast.Name) and target.id in ("openapi_types", "attribute_map"):
                    found[target.id] = ast.literal_eval(item.value)  # type: ignore[union-attr]
            required = set(re.findall(r"Invalid value for `(\w+)`, must not be `None`", source))
            types[node.name] = (found["openapi_types"], found["attribute_map"], required)
    return types


def _pod_with(kind: str, value: Any) -> dict[str, Any]:
    """A Kubernetes type checked by putting it where a Pod holds one."""
    holder: dict[str, Callable[[Any], dict[str, Any]]] = {
        "V1Container": lambda v: {"containers": [v]},
        "V1Volume": lambda v: {"containers": [{"name": "c"}], "volumes": [v]},
        "V1Toleration": lambda v: {"containers": [{"name": "c"}], "tolerations": [v]},
        "V1LocalObjectReference": lambda v: {"containers": [{"name": "c"}], "imagePullSecrets": [v]},
        "V1Affinity": lambda v: {"containers": [{"name": "c"}], "affinity": v},
    }
    if kind not in holder:
        pytest.fail(f"no way to validate the Kubernetes type {kind} here: add one")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": holder[kind](value)}


def _check(value: Any, typ: str, where: str) -> None:
    import kubernetes_validate

    if typ.startswith("list["):
        assert isinstance(value, list), f"{where}: a list"
        for i, v in enumerate(value):
            _check(v, typ[5:-1], f"{where}[{i}]")
    elif typ.startswith("dict("):
        assert isinstance(value, dict), f"{where}: a map"
        inner = typ[5:-1].split(", ", 1)[1]
        for k, v in value.items():
            _check(v, inner, f"{where}.{k}")
    elif typ in ("str", "int", "bool", "float", "object"):
        kinds = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
        assert isinstance(value, kinds[typ]), f"{where}: {typ}, got {value!r}"
    elif typ.startswith("V1") and typ not in _kserve_types():  # a Kubernetes type
        kubernetes_validate.validate(_pod_with(typ, value), K8S_VERSION, strict=True)
    else:
        fields, keys, required = _kserve_types()[typ]
        assert isinstance(value, dict), f"{where}: an object ({typ})"
        by_key = {v: k for k, v in keys.items()}
        unknown = set(value) - set(by_key)
        assert not unknown, f"{where}: {sorted(unknown)} not fields of {typ}"
        for name in required:
            assert keys[name] in value, f"{where}: {typ} needs {keys[name]}"
        for key, v in value.items():
            _check(v, fields[by_key[key]], f"{where}.{key}")


def _check_resource(doc: dict[str, Any], kind: str, group_version: str) -> None:
    assert doc["apiVersion"] == f"serving.kserve.io/{group_version}" and doc["kind"] == kind
    version = group_version.replace("v1alpha1", "V1alpha1").replace("v1beta1", "V1beta1")
    _check(doc["spec"], f"{version}{kind}Spec", kind)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


def test_the_kserve_runtime_and_service_are_valid_kserve_objects() -> None:
    (runtime,) = _docs(ROOT / "deploy/kserve/servingruntime.yaml")
    (isvc,) = _docs(ROOT / "deploy/kserve/inferenceservice.yaml")
    _check_resource(runtime, "ServingRuntime", "v1alpha1")
    _check_resource(isvc, "InferenceService", "v1beta1")
    spec = runtime["spec"]
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"onnx", "openvino"}
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    # the runtime's command line is one milliserve accepts, with the ports KServe expects
    (container,) = spec["containers"]
    settings = _parse_serve(container["args"])
    assert str(settings.model_repository) == "/mnt/models" and settings.http.port == 8080
    assert container["ports"][0]["containerPort"] == settings.http.port


def _parse_serve(argv: list[str]) -> Any:
    from milliserve.cli.main import build_parser
    from milliserve.cli.serve import serve_settings

    assert argv[:2] == ["milliserve", "serve"]
    return serve_settings(build_parser().parse_args(argv[1:]))


# ---- the Dockerfile, run as the container would run it ----


def _dockerfile() -> dict[str, Any]:
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, Any] = {"ENV": {}, "EXPOSE": []}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        op, _, rest = line.strip().partition(" ")
        if op == "ENV":
            out["ENV"].update(dict(tok.split("=", 1) for tok in shlex.split(rest)))
        elif op == "EXPOSE":
            out["EXPOSE"] += [int(p) for p in rest.split()]
        elif op == "HEALTHCHECK":
            out[op] = yaml.safe_load(rest.split(" CMD ", 1)[1])
        elif op in ("CMD", "ENTRYPOINT"):
            out[op] = yaml.safe_load(rest)  # exec form: a JSON list
        else:
            out[op] = rest
    return out


def test_the_dockerfile_is_slim_non_root_and_signal_safe() -> None:
    d = _dockerfile()
    assert d["FROM"].endswith("-slim")
    assert d["USER"].isdigit() and int(d["USER"]) != 0
    assert d["EXPOSE"] == [8000, 8001, 8002]
    assert d["STOPSIGNAL"] == "SIGTERM"
    assert d["ENTRYPOINT"] == ["tini", "--"] and d["CMD"] == ["milliserve", "serve"]
    assert d["HEALTHCHECK"][0] == "python"
    from milliserve.config.settings import Settings

    ours = {k: v for k, v in d["ENV"].items() if k.startswith("MILLISERVE_")}
    settings = Settings(**_settings_from_env(ours))  # the CMD takes everything from ENV
    assert str(settings.model_repository) == "/models" and settings.host == "0.0.0.0"


def test_the_container_command_serves_probes_and_drains_within_the_grace_period(
    example_repo: Path, write_slow: Callable[..., Path]
) -> None:
    d = _dockerfile()
    pod = _deployment()["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    work = Path(tempfile.mkdtemp(prefix="ms-container-"))
    models = work / "models"
    shutil.copytree(example_repo / "fraud_mlp", models / "fraud_mlp")
    write_slow(models, steps=600)  # each request runs long enough for all 4 to be held at SIGTERM
    for p in [work, *work.rglob("*")]:  # readable by the image's user
        p.chmod(p.stat().st_mode | stat.S_IROTH | stat.S_IXOTH)
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ, **d["ENV"])
    env.update(
        MILLISERVE_MODEL_REPOSITORY=str(models),
        MILLISERVE_HOST="127.0.0.1",  # the image binds 0.0.0.0; tests stay on loopback
        MILLISERVE_HTTP__PORT=str(http),
        MILLISERVE_GRPC__PORT=str(grpc),
        MILLISERVE_METRICS__PORT=str(metrics),
    )
    cmd = [str(Path(sys.executable).parent / d["CMD"][0]), *d["CMD"][1:]]
    log = (work / "server.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        probe = _deployment()["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        ready = f"http://127.0.0.1:{http}{probe['httpGet']['path']}"
        wait_until(lambda: _ok(ready), 120, "the readiness probe")
        check = [sys.executable if a == "python" else a for a in d["HEALTHCHECK"]]
        assert subprocess.run(check, env=env, timeout=30, check=False).returncode == 0
        url = f"http://127.0.0.1:{http}/v2/models/slow/infer"
        metrics_url = f"http://127.0.0.1:{metrics}/metrics"

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(post_status, url, slow_body()) for _ in range(4)]
            # SIGTERM closes the listeners: a request not yet connected is refused, as it should be,
            # so the signal waits until every one of them is held (queued or running)
            held = lambda: sum(pending_requests(metrics_url, "slow").values())  # noqa: E731
            wait_until(lambda: held() >= 4, 60, "all 4 in flight")
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            codes = [f.result() for f in futures]
            rc = proc.wait(grace)
        assert codes == [200] * 4
        assert rc == 0 and time.monotonic() - sent < grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
