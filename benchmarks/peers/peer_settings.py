"""Every setting the Python peers benchmark gives a server, with why: run_peers.py starts the
servers with these and its section of docs/benchmarks.md prints them. A peer is set up the
way its own documentation recommends for low latency, and all of them alike where they can be.

A setting is (value, why); change the value here, and its reason with it.
"""

from __future__ import annotations

Settings = dict[str, tuple[str, str]]

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
        "budget of a few milliseconds can spend, the same for every peer",
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
    "workers_per_device": ("1", "one inference worker, as the other peers have"),
}

BENTOML: Settings = {
    "max_latency_ms": (
        "2",
        "BentoML's adaptive batching: its docs call it the longest a batch waits to gather requests "
        "and say to set it from the service's latency requirement: the 2 ms window every server gets (a "
        "request its dispatcher predicts to miss it gets 503, counted in the errors column)",
    ),
    "max_batch_size": ("32", "requests per batch (as every server)"),
    "workers": ("1", "one service worker, as the other peers have"),
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
