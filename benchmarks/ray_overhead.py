"""What Ray Serve costs per request: milliserve alone against milliserve behind Ray Serve's
HTTP proxy, same model, same client; and the two ways to put milliserve behind the proxy.

    python benchmarks/ray_overhead.py [--rounds 3] [--seconds 5]
    python benchmarks/ray_overhead.py --quick      # one short round, to check the script

- **alone**: ``milliserve serve`` on its own HTTP port.
- **Ray ingress** (what ``milliserve ray serve`` deploys): Serve's proxy hands each request
  to a replica as an ASGI call into milliserve's own HTTP app.
- **Ray forward** (the alternative: replicas keep their own ports): each replica starts a
  ``milliserve serve`` subprocess and forwards the request to it over loopback HTTP.

The example fraud_mlp (microseconds of compute: the path is what is measured), one replica
with 1 CPU reserved, a local Ray cluster on 127.0.0.1, perf_analyzer over HTTP at
concurrency 1 and 8, the three measured in turn, rounds rotating the order, medians. The
client, Ray and the server share the machine's 2 vCPUs.

Writes the "ray-serve" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from bench_vs_perf_analyzer import pa_level, perf_analyzer, rounds_args
from report_sections import write_section
from server_overhead import cpu_description

from milliserve.config.settings import ray_env
from milliserve.examples.fraud_mlp import build_fraud_mlp
from milliserve.testing import ServerProcess, free_port, wait_until

LEVELS = (1, 8)
VARIANTS = ("alone", "Ray ingress", "Ray forward")


def forward_app(repo: str) -> Any:
    """Replicas that keep their own ports: a milliserve subprocess per replica, the request
    forwarded to it over loopback HTTP."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment(name="forward", ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
    class Forward:
        def __init__(self) -> None:
            self.server = ServerProcess(Path(repo)).start()
            self.client = httpx.AsyncClient(base_url=f"http://{self.server.http_url}", timeout=60)

        async def __call__(self, request: Request) -> Response:
            path = request.url.path.removeprefix("/fwd")
            body = await request.body()
            keep = ("content-type", "inference-header-content-length")
            headers = {k: v for k, v in request.headers.items() if k.lower() in keep}
            r = await self.client.request(request.method, path, content=body, headers=headers)
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

        def __del__(self) -> None:
            self.server.stop()

    return Forward.bind()


def main() -> None:
    args = rounds_args()
    os.environ.update(ray_env())
    pa, env = perf_analyzer()
    work = Path(tempfile.mkdtemp(prefix="ms-ray-"))
    repo = work / "repo"
    build_fraud_mlp(repo)
    ray_bin = str(Path(sys.executable).parent / "ray")
    port = free_port()
    subprocess.run(
        [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
         "--include-dashboard=false", "--num-cpus=2", "--object-store-memory=134217728",
         "--disable-usage-stats"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    try:
        import ray
        from ray import serve

        from milliserve.integrations.ray import milliserve_app

        ray.init(address=f"127.0.0.1:{port}", namespace="serve", log_to_driver=False)
        proxy = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": proxy})
        serve.run(
            milliserve_app(repo, min_replicas=1, max_replicas=1, num_cpus=1), name="ingress", route_prefix="/"
        )
        serve.run(forward_app(str(repo)), name="forward", route_prefix="/fwd")
        with ServerProcess(repo) as alone:
            urls = {"alone": alone.http_url, "Ray ingress": f"127.0.0.1:{proxy}"}
            wait_until(lambda: httpx.get(f"http://127.0.0.1:{proxy}/v2/health/ready").status_code == 200, 120)
            fwd = _forward_url(proxy)
            urls["Ray forward"] = fwd
            for rnd in range(args.rounds):
                order = VARIANTS[rnd % 3 :] + VARIANTS[: rnd % 3]
                for conc in LEVELS:
                    for v in order:
                        out = work / f"{v.replace(' ', '_')}-{conc}-{rnd}.csv"
                        r = pa_level(pa, env, urls[v], "fraud_mlp", conc, int(args.seconds * 1000), out)
                        results.setdefault((v, conc), []).append(r)
                        print(
                            f"round {rnd} {v} c{conc}: {r[0]:.0f} infer/s p50 {r[1]:.2f} ms p99 {r[2]:.2f} ms"
                        )
        serve.shutdown()
        ray.shutdown()
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, timeout=120, check=False)
        # the forwarding replicas' servers outlive a killed replica: stop them by their repository
        subprocess.run(["pkill", "-f", f"milliserve serve {repo} "], check=False)
    if args.quick:
        print("quick run: no report written")
        return
    write_section(
        "ray-serve",
        report(args, results),
        results={
            "settings": {"run": vars(args), "variants": VARIANTS, "levels": LEVELS},
            "rounds": args.rounds,
            "values": results,  # (variant, concurrency) -> each round's (infer/s, p50 ms, p99 ms)
            "peers": {"ray": None, "tritonclient": None},  # None: the version installed
        },
    )
    print("wrote the ray-serve section of docs/benchmarks.md")


def _forward_url(proxy: int) -> str:
    """perf_analyzer calls /v2/...; the forwarding app lives under /fwd: a tiny prefix-free
    route is not possible beside the ingress app, so perf_analyzer gets the prefix in -u."""
    return f"127.0.0.1:{proxy}/fwd"


def report(args: argparse.Namespace, results: dict[tuple[str, int], list[tuple[float, float, float]]]) -> str:
    def med(v: str, c: int, i: int) -> float:
        return statistics.median(r[i] for r in results[(v, c)])

    lines = [
        "## Ray Serve: what the proxy costs",
        "",
        f"`python benchmarks/ray_overhead.py --rounds {args.rounds} --seconds {args.seconds:g}`: "
        f"{cpu_description()}; a local Ray cluster on 127.0.0.1, perf_analyzer over HTTP, all on the "
        "same vCPUs. fraud_mlp (microseconds of compute), one replica. *alone*: `milliserve serve`; "
        "*Ray ingress*: `milliserve ray serve` (Serve's proxy calls milliserve's HTTP app inside the "
        "replica); *Ray forward*: the replica forwards to a `milliserve serve` of its own over loopback. "
        f"{args.seconds:g} s per level, {args.rounds} rounds rotating the order, medians.",
        "",
        "| path | c1 p50 ms | c1 p99 ms | c1 infer/s | c8 p50 ms | c8 infer/s |",
        "|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        lines.append(
            f"| {v} | {med(v, 1, 1):.2f} | {med(v, 1, 2):.2f} | {med(v, 1, 0):,.0f} | "
            f"{med(v, 8, 1):.2f} | {med(v, 8, 0):,.0f} |"
        )
    a, b = med("alone", 1, 1), med("Ray ingress", 1, 1)
    lines += [
        "",
        f"Ray Serve adds {b - a:.2f} ms to a sequential request's p50 ({b / a:.0f}× milliserve alone).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
