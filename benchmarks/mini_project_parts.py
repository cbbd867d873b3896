"""The pieces of benchmarks/mini_project.py: accuracy through an endpoint, stage timings
(milliserve's /metrics, the naive app's /timings), the capacity search, the report table
and the waterfall chart."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from report_sections import bench_level

from milliserve.plotting import pyplot

ROOMY = {"x-request-deadline-ms": "10000"}  # accuracy passes are not about latency


@dataclass
class StepResult:
    name: str
    change: str
    rows: list[dict[str, Any]]  # one bench level per round at the fixed load
    capacity: float  # req/s at p99 within the SLO
    accuracy: float  # the median of the passes
    accuracies: list[float] = field(default_factory=list)  # each pass's

    def accuracy_cell(self) -> str:
        if len(self.accuracies) < 2:
            return f"{self.accuracy:.3f}"
        return f"{self.accuracy:.3f} ({min(self.accuracies):.3f}–{max(self.accuracies):.3f})"

    def median(self, key: str) -> float:
        return float(np.median([r["latency_us"].get(key, float("nan")) for r in self.rows])) / 1000

    def best(self, key: str) -> float:
        return min(r["latency_us"].get(key, float("nan")) for r in self.rows) / 1000

    def worst(self, key: str) -> float:
        """The worst round's latency percentile, ms (rounds are interleaved: the spread is noise)."""
        return max(r["latency_us"].get(key, float("nan")) for r in self.rows) / 1000

    @property
    def not_served(self) -> float:
        requests = sum(r["requests"] for r in self.rows)
        return (requests - sum(r["ok"] for r in self.rows)) / max(requests, 1)

    @property
    def throughput(self) -> float:
        return float(np.mean([r["throughput"] for r in self.rows]))

    def stages(self) -> dict[str, float]:
        names = list(dict.fromkeys(k for r in self.rows for k in r["stages_ms"]))
        return {n: float(np.mean([r["stages_ms"].get(n, 0.0) for r in self.rows])) for n in names}


def wait_answering(base: str, timeout_s: float = 180.0) -> None:
    """Poll the naive app until it answers a request (it loads its model first)."""
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}]}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{base}/v2/models/sentiment/infer", json=body, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{base} did not answer within {timeout_s:.0f} s")


def flush_redis(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"FLUSHALL\r\n")
        if not c.recv(16).startswith(b"+OK"):
            raise RuntimeError("redis FLUSHALL failed")


def _label_of(answer: dict[str, Any]) -> int:
    out = {o["name"]: o["data"] for o in answer["outputs"]}
    if "label" in out:
        return int(out["label"][0] == "positive")
    return int(np.argmax(out["probabilities"]))


def accuracy_of(
    client: httpx.Client,
    url: str,
    model: str,
    texts: list[str],
    labels: np.ndarray[Any, Any],
    tokens: Path | None = None,
) -> Callable[[], float]:
    """A function measuring accuracy on ``texts`` through the endpoint (gRPC for grpc://);
    ``tokens``: a tokenizer.json, the client sends token ids (the bare model)."""

    def http(text: str) -> int:
        if tokens is not None:
            e = tok.encode(text)
            n = len(e.ids)
            inputs = [
                {"name": "input_ids", "datatype": "INT64", "shape": [1, n], "data": e.ids},
                {"name": "attention_mask", "datatype": "INT64", "shape": [1, n], "data": e.attention_mask},
            ]
        else:
            inputs = [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]
        r = client.post(f"{url}/v2/models/{model}/infer", json={"inputs": inputs}, headers=ROOMY)
        r.raise_for_status()
        return _label_of(r.json())

    def grpc(text: str) -> int:
        from tritonclient import grpc as grpcclient

        inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        out = grpc_client.infer(model, [inp], headers=ROOMY).as_numpy("label")
        return int(out[0][0] == b"positive")

    def measure() -> float:
        nonlocal tok, grpc_client
        if tokens is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tokens))
            tok.no_padding()  # the packaged tokenizer.json pads to 128
            tok.enable_truncation(64)
        if url.startswith("grpc://"):
            from tritonclient import grpc as grpcclient

            grpc_client = grpcclient.InferenceServerClient(url.removeprefix("grpc://"))
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(grpc if url.startswith("grpc://") else http, texts))
        return float((np.array(got) == labels).mean())

    tok: Any = None
    grpc_client: Any = None
    return measure


def naive_stages(client: httpx.Client, base: str) -> Callable[[], dict[str, float]]:
    """Mean ms per request in the naive app's tokenizer and model since the last call."""

    def read() -> dict[str, float]:
        t = client.get(f"{base}/timings").json()
        n = max(t["count"], 1.0)
        return {
            "tokenize": 1000 * t["tokenize"] / n,
            "infer": 1000 * t["infer"] / n,
            "other server": 1000 * (t["handler"] - t["tokenize"] - t["infer"]) / n,
        }

    return read


def naive_settle(client: httpx.Client, base: str, quiet_s: float = 1.0) -> Callable[[], None]:
    """Wait until the naive app has finished every request it accepted: an overloaded
    uvicorn keeps working through requests whose clients gave up, which would steal the
    cores from whatever runs next. Idle = no request completed for ``quiet_s``."""

    def settle() -> None:
        client.get(f"{base}/timings")
        while True:
            time.sleep(quiet_s)
            if client.get(f"{base}/timings").json()["count"] == 0:
                return

    return settle


def pause(seconds: float = 1.0) -> Callable[[], None]:
    """milliserve's queues are bounded by deadlines: a second is enough to empty them."""
    return lambda: time.sleep(seconds)


def milliserve_stages(client: httpx.Client, metrics_url: str, model: str) -> Callable[[], dict[str, float]]:
    """Mean ms per request in each of ``model``'s stages since the last call (/metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    last: dict[tuple[str, str], float] = {}

    def snapshot() -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for fam in text_string_to_metric_families(client.get(metrics_url).text):
            if fam.name != "milliserve_stage_duration_seconds":
                continue
            for s in fam.samples:
                if s.labels.get("model") == model and s.name.endswith(("_sum", "_count")):
                    kind = "sum" if s.name.endswith("_sum") else "count"
                    key = (s.labels["stage"], kind)
                    out[key] = out.get(key, 0.0) + s.value
        return out

    def read() -> dict[str, float]:
        nonlocal last
        now = snapshot()
        stages = sorted({k for k, _ in now})
        counts = {st: now.get((st, "count"), 0.0) - last.get((st, "count"), 0.0) for st in stages}
        # per request, not per request that reached the stage: a cache hit spends nothing in infer
        requests = max(counts.values(), default=0.0)
        out = {}
        for st in stages:
            total = now.get((st, "sum"), 0.0) - last.get((st, "sum"), 0.0)
            if requests > 0 and counts[st] > 0:
                out[st] = 1000 * total / requests
        last = now
        return out

    return read


def capacity_search(step: Any, naive_capacity: float, work: Path, seconds: float, slo_ms: float) -> float:
    """The highest offered rate whose p99 is within the SLO with at most 0.1% not served:
    from a quarter of the naive capacity, up by 1.4× while it holds (down by 1.4× while
    it does not, to 1 req/s; 0 when even that fails). A rate fails only when a second probe
    fails too: a p99 over a few hundred requests is close to the slowest one, so one hiccup of
    a shared VM would otherwise cap a step's capacity."""

    def holds(rate: float) -> bool:
        step.before_run()
        level = bench_level(
            step.url,
            step.model,
            work / "probe.json",
            "--rate",
            f"{rate:.2f}",
            *step.data,
            seconds=min(seconds, 10.0),
        )
        not_served = 1 - level["ok"] / max(level["requests"], 1)
        ok = level["latency_us"].get("p99", float("inf")) / 1000 <= slo_ms and not_served <= 0.001
        step.settle()
        return bool(ok)

    def sustains(rate: float) -> bool:
        return holds(rate) or holds(rate)

    rate = 0.25 * naive_capacity
    if not sustains(rate):
        while rate > 1.0:
            rate /= 1.4
            if sustains(rate):
                return rate
        return 0.0
    for _ in range(16):
        if not sustains(rate * 1.4):
            break
        rate *= 1.4
    return rate


def render(
    results: list[StepResult],
    naive_throughput: float,
    load: float,
    rounds: int,
    seconds: float,
    cpu: str,
    slo: float,
    measured_at: str = "",
) -> str:
    """The section; ``measured_at`` is the commit the run measured (a run saved before
    results kept it has none). Capacities are compared at the same SLO (each step's against
    the naive service's); p99s only where the fixed load is one both steps sustained."""
    naive, final = results[0], results[-1]
    passes = max(len(r.accuracies) for r in results)
    overloaded = [r.name for r in results if r.capacity < load]
    lines = [
        "## The seeds' mini project: a sentiment service, step by step",
        "",
        f"`benchmarks/mini_project.py`{f' at commit {measured_at}' if measured_at else ''}. {cpu}. "
        "Server, Redis and the load generator share these cores.",
        "Capacity: the highest Poisson rate (×1.4 steps, from the naive service's closed-loop "
        f"throughput, {naive_throughput:.0f} req/s at 4 connections) with p99 ≤ {slo:.0f} ms and ≤ 0.1% "
        "not served (a rate fails only when a second probe fails too), for every step, the naive "
        "service's included; its multiple is of the naive "
        f"service's capacity at the same SLO. Then open-loop Poisson at **{load:.0f} req/s**, "
        f"{rounds} interleaved rounds of {seconds:.0f} s per step; the worst round's percentiles in the "
        "columns, the median rounds in the ratios. "
        + (
            f"That load is above the capacity of: {', '.join(overloaded)} (a run made before the load "
            "was chosen from the capacities); there a p99 is a queue growing over the window, so no "
            "p99 ratio with it is given. "
            if overloaded
            else "That load is 70% of the lowest capacity, so every step sustains it. "
        )
        + "Accuracy: the 1000 held-out tweets through each step's endpoint, 4 at a time; for "
        f"milliserve's steps the median (and range) of {passes} passes, because its batches mix those "
        "4 tweets differently each pass and the INT8 dynamic model's scores move with their batch "
        "mates; one pass for the naive services, which run one tweet at a time.",
        "",
        "| step | what changed | p50 ms | p95 ms | p99 ms | naive p99 / this (median rounds; naive's best / "
        "this step's worst) | throughput req/s | "
        f"not served | capacity at p99 ≤ {slo:.0f} ms (× naive's at the same SLO) | accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = (
            "— (overloaded)"
            if naive.name in overloaded or r.name in overloaded
            else f"{naive.median('p99') / r.median('p99'):.1f}× ({naive.best('p99') / r.worst('p99'):.1f}×)"
        )
        lines.append(
            f"| {r.name} | {r.change} | {r.worst('p50'):.1f} | {r.worst('p95'):.1f} | {r.worst('p99'):.1f} | "
            f"{ratio} | {r.throughput:.1f} | {r.not_served:.2%} | "
            f"{r.capacity:.0f} req/s ({r.capacity / max(naive.capacity, 1e-9):.1f}×) | {r.accuracy_cell()} |"
        )
    p99_gain = naive.median("p99") / final.median("p99")
    p99_floor = naive.best("p99") / final.worst("p99")
    cap_gain = final.capacity / max(naive.capacity, 1e-9)
    if naive.name in overloaded or final.name in overloaded:
        p99_row = (
            f"| p99 at the fixed load ≥ 10× lower than naive | not measured: {load:.0f} req/s is past "
            "what one of the two sustains | — |"
        )
    else:
        p99_row = (
            "| p99 at the fixed load ≥ 10× lower than naive (median rounds; naive's best against the "
            f"final step's worst: {p99_floor:.1f}×) | {p99_gain:.1f}× | {_met(p99_gain >= 10)} |"
        )
    lines += [
        "",
        "| target | measured | met |",
        "|---|---|---|",
        p99_row,
        f"| capacity at p99 ≤ {slo:.0f} ms ≥ 5× naive's at the same SLO | {cap_gain:.1f}× | "
        f"{_met(cap_gain >= 5)} |",
        f"| not served at the fixed load ≤ 0.1% | {final.not_served:.2%} | "
        f"{_met(final.not_served <= 0.001)} |",
        f"| accuracy within 1 point of naive (the final step's median pass) | "
        f"{100 * (final.accuracy - naive.accuracy):+.1f} points | "
        f"{_met(abs(final.accuracy - naive.accuracy) <= 0.01)} |",
        "",
        "What each step bought (p99 at the fixed load, the step before → this step):",
        "",
    ]
    for prev, r in itertools.pairwise(results):
        lines.append(
            f"- {r.name}: {prev.worst('p99'):.1f} → {r.worst('p99'):.1f} ms; capacity {prev.capacity:.0f} → "
            f"{r.capacity:.0f} req/s: {_verdict(prev, r)}"
        )
    failed = [(r.name, k, n) for r in results for row in r.rows for k, n in row["errors"].items()]
    if failed:
        lines += ["", "Requests not served at the fixed load (all rounds):", ""]
        lines += [f"- {name}: {n} × {kind}" for name, kind, n in failed]
    lines += ["", "Where the time went (mean ms per request at the fixed load):", ""]
    names = list(dict.fromkeys(n for r in results for n in r.stages()))
    lines += [
        "| step | " + " | ".join(names) + " | client, network, framework |",
        "|---" * (len(names) + 2) + "|",
    ]
    for r in results:
        st = r.stages()
        rest = max(np.mean([row["latency_us"]["mean"] for row in r.rows]) / 1000 - _server_ms(st), 0.0)
        lines.append(
            f"| {r.name} | " + " | ".join(f"{st.get(n, 0.0):.2f}" for n in names) + f" | {rest:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _verdict(prev: StepResult, r: StepResult) -> str:
    """What a step bought, in words: a tenth better is the least that counts."""
    p99 = prev.worst("p99") / r.worst("p99")
    cap = r.capacity / max(prev.capacity, 1e-9)
    bought = [w for w, gain in (("p99", p99), ("capacity", cap)) if gain >= 1.1]
    cost = [w for w, gain in (("p99", p99), ("capacity", cap)) if gain <= 1 / 1.1]
    if not bought and not cost:
        return "bought nothing measurable here"
    text = f"bought {' and '.join(bought)}" if bought else ""
    if cost:
        text += ("; " if text else "") + f"cost {' and '.join(cost)}"
    return text


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _server_ms(stages: dict[str, float]) -> float:
    return sum(v for k, v in stages.items() if k != "total")


def draw_waterfall(results: list[StepResult], path: Path) -> Path:
    """One horizontal bar per step, its mean time split by stage."""
    plt = pyplot("the mini project's waterfall")
    names = list(dict.fromkeys(n for r in results for n in r.stages() if n != "total"))
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(results) + 1.8))
    colors = plt.get_cmap("tab20").colors
    shown: set[str] = set()
    for i, r in enumerate(results):
        st = r.stages()
        left = 0.0
        parts = [(n, st.get(n, 0.0)) for n in names]
        rest = max(np.mean([row["latency_us"]["mean"] for row in r.rows]) / 1000 - _server_ms(st), 0.0)
        parts.append(("client, network, framework", rest))
        for j, (name, ms) in enumerate(parts):
            new = ms > 0 and name not in shown
            shown.update([name] if new else [])
            ax.barh(i, ms, left=left, color=colors[j % len(colors)], label=name if new else None)
            left += ms
        ax.text(left, i, f" {left:.1f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(results)), [r.name for r in results])
    ax.invert_yaxis()
    ax.set_xlabel("mean ms per request at the fixed load (linear: the bars compare)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Where the time went, step by step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
