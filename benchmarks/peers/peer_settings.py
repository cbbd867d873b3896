"""Every setting the peer benchmarks give a server, with why, and every peer's pinned version:
run_peers.py and embeddings.py start the servers with these and their sections of
docs/benchmarks.md print them. A peer runs at the fastest configuration its own
documentation offers for the load, and all of them alike where they can be.

A setting is (value, why); change the value here, and its reason with it. What was tried
for each peer, and why the kept setting is its best, is in the reason.
"""

from __future__ import annotations

Settings = dict[str, tuple[str, str]]

# Every peer's pinned version, and the pins of what our apps around a peer import (a peer's
# venv is built from these on first use; a section names the versions it measured). What a
# peer brings itself (numpy; infinity-emb's and fastembed's ONNX Runtime) is left to its own
# pins: infinity-emb wants numpy<2, for one. Change a pin here, then remove its venv under
# build/peers/venvs so that it is built again.
VERSIONS: dict[str, str] = {
    "mlserver": "1.7.1",
    "litserve": "0.2.19",
    "pyzmq": "27.2.0",  # LitServe's fast_queue transport
    "bentoml": "1.4.40",
    "nvidia-pytriton": "0.7.0",
    "infinity-emb": "0.0.78",
    "fastembed": "0.9.1",
    # its onnx extra needs optimum-onnx 0.1.0, which needs transformers<4.58; 6.x needs
    # transformers 5: 5.7.0 is the newest whose ONNX backend installs
    "sentence-transformers": "5.7.0",
    "torch": "2.13.0",
    "onnxruntime": "1.32.0",  # as milliserve's own venv
    "fastapi": "0.165.0",
    "uvicorn": "0.55.0",
}


def pin(*names: str) -> list[str]:
    """``name==version`` for each peer package (a name with extras keeps them: ``a[b]``)."""
    return [f"{n}=={VERSIONS[n.split('[')[0]]}" for n in names]


# the worker counts LitServe and BentoML run with, a row each: one, as every server has, and
# one per vCPU of these 2-vCPU machines (their docs offer more workers for throughput)
WORKERS_SWEPT = (1, 2)

# every server: the same model, the same thread
EVERYONE: Settings = {
    "intra_op_num_threads": (
        "1",
        "ONNX Runtime's threads inside an operator: fraud_mlp runs in microseconds, and on 2 shared "
        "vCPUs a second thread only contends (the project's rule: pin ONNX Runtime's threads)",
    ),
    "batch window": (
        "2 ms",
        "the longest a batching peer holds a request for others to join: the window a real-time "
        "budget of a few milliseconds can spend, the same for every peer that has such a setting "
        "(BentoML has none: its dispatcher sizes its own window, see below)",
    ),
    "max batch": ("32", "the most requests in one batch, the same for every peer"),
}

MLSERVER: Settings = {
    "max_batch_time": (
        "0.002",
        "MLServer's adaptive batching: seconds a batch waits to fill (its docs: set with max_batch_size; "
        "the smaller, the lower the latency)",
    ),
    "max_batch_size": ("32", "requests per batch (as every server)"),
    "parallel_workers": (
        "0",
        "inference in the server process: MLServer 1.7's worker processes crash at start on this "
        'Python ("no current event loop")',
    ),
}

LITSERVE: Settings = {
    "batch_timeout": (
        "0.002",
        "LitServe's seconds to wait for a batch to fill (the window every server gets)",
    ),
    "max_batch_size": ("32", "requests per batch (as every server)"),
    "workers_per_device": (
        "1 and 2 (rows of each)",
        "inference worker processes: one, as the other peers have, and one per vCPU (its docs: "
        "more workers per device raise throughput); ONNX Runtime has one thread in each",
    ),
    "fast_queue": (
        "True",
        "ZeroMQ between the API server and the inference worker instead of multiprocessing "
        "queues: LitServer's docstring gives it for high throughput (over 100 requests/s, "
        "which every load here is) and its production example sets it; the run at 7d0ed18 had "
        "it off",
    ),
    "access log": ("off", "no line logged per request (uvicorn's access log), as milliserve here"),
}

BENTOML: Settings = {
    "max_latency_ms": (
        "50",
        "BentoML's adaptive batching: not a batch window but the service's latency target (its "
        "docs: set it from the latency requirement; the dispatcher refuses with 503 what it "
        "predicts would miss it, and sizes its own window by regression on recent batches). 2 ms "
        "was tried first, as the window every server gets: its dispatcher then refused 6,135 "
        "requests at 8 connections; 50 ms is this project's p99 objective, so a refusal means a "
        "request it could not have served in time",
    ),
    "max_batch_size": ("32", "requests per batch (as every server)"),
    "workers": (
        "1 and 2 (rows of each)",
        "service worker processes: one, as the other peers have, and one per vCPU (its docs offer "
        '`workers="cpu_count"`, one per CPU, for CPU-bound services)',
    ),
    "access log": ("off", "`logging.access.enabled: false`: no line logged per request, as milliserve here"),
}

MILLISERVE: Settings = {
    "dynamic_batching": (
        "its example config (preferred 8/16, 200 µs)",
        "milliserve's own low-latency defaults: work-conserving, so a lone request never waits",
    ),
}


def lines() -> list[str]:
    """The settings as markdown bullets, for the section."""
    out = []
    for peer, settings in (
        ("every server", EVERYONE),
        ("MLServer", MLSERVER),
        ("LitServe", LITSERVE),
        ("BentoML", BENTOML),
        ("milliserve", MILLISERVE),
    ):
        out.append(f"- **{peer}:** " + "; ".join(f"`{k}` {v} ({why})" for k, (v, why) in settings.items()))
    return out
