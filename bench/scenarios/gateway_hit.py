"""Benchmark: gateway hits against a bare aiohttp app returning the same bytes, on benchmark-shaped and on
ingress-shaped traffic (issue 26's check).

Same run, same load tool (wrk), same worker count, same request body; the ratios are what count. Two traffic
shapes: identical request bytes, and the same request with a unique `X-Request-Id` and `traceparent` on every
request, as every ingress, load balancer and CDN adds (the realistic one). Rows: the gateway's L1 hit, its L2 hit
(a real Redis, L1 off) and bare aiohttp, each in both shapes.
`python -m bench gateway_hit [--workers N] [--duration S] [--repeats R]`. The full suite is `bench gateway`.
"""

from __future__ import annotations

import argparse
import platform
from contextlib import ExitStack
from pathlib import Path

from bench.measure.hits import HEADERS, REQUEST, Target, measure, post
from bench.measure.load import LoadResult, print_table, write_results
from harness.peers.gateways import bare_aiohttp
from harness.processes import PYTHON, free_port, server
from harness.services import RedisServer


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def prime(url: str, tier: str) -> bytes:
    for _ in range(50):  # each worker has its own L1: post until one answers with a hit
        body, headers = post(url)
        if (
            headers.get("Cache-Status", "").startswith("tokenedge; hit")
            and f"detail={tier}" in headers["Cache-Status"]
        ):
            return body
    raise RuntimeError(f"no {tier} hit after 50 identical requests")


def run(workers: int, duration_s: int, repeats: int, connections: int) -> dict[str, LoadResult]:
    with ExitStack() as stack:
        up_port = free_port()
        stack.enter_context(
            server(
                [PYTHON, "-m", "harness.peers.servers", "upstream", str(up_port)],
                f"http://127.0.0.1:{up_port}/health",
            )
        )
        redis = RedisServer()
        redis.start()
        stack.callback(redis.stop)
        gateways = {}
        for tier, env in (
            ("l1", {}),
            ("l2", {"TOKENEDGE_CACHE_REDIS_URL": redis.url, "TOKENEDGE_CACHE_L1_MAX_BYTES": "0"}),
        ):
            port = free_port()
            proc = stack.enter_context(
                server(
                    [PYTHON, "-m", "gateway", "--workers", str(workers), "--port", str(port)],
                    f"http://127.0.0.1:{port}/health",
                    env={"TOKENEDGE_UPSTREAM_URL": f"http://127.0.0.1:{up_port}", **env},
                )
            )
            gateways[tier] = (f"http://127.0.0.1:{port}/v1/chat/completions", [proc.pid])
        hit_body = prime(gateways["l1"][0], "l1")
        prime(gateways["l2"][0], "l2")
        bare_url, bare_pids = stack.enter_context(bare_aiohttp(hit_body, workers))
        targets: dict[str, Target] = {}
        for shape, ingress in (("ingress ids", True), ("same bytes", False)):
            targets[f"gateway L1 hit ({shape})"] = (*gateways["l1"], REQUEST, HEADERS, ingress)
            targets[f"gateway L2 hit ({shape})"] = (*gateways["l2"], REQUEST, HEADERS, ingress)
            targets[f"bare aiohttp ({shape})"] = (bare_url, bare_pids, REQUEST, HEADERS, ingress)
        return measure(
            targets, duration_s=duration_s, repeats=repeats, connections=connections, warm=workers * 4
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench gateway_hit", description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args(argv)
    payload: dict[str, object] = {"cpu": cpu_name()}
    for workers in args.workers:
        results = run(workers, args.duration, args.repeats, args.connections)
        print_table(
            f"Hits vs bare aiohttp, {workers} worker(s), wrk -t1 -c{args.connections} -d{args.duration}s, "
            f"median of {args.repeats}, {cpu_name()}",
            list(results.items()),
            "bare aiohttp (ingress ids)",
        )
        rps = {name: r.rps for name, r in results.items()}
        ratios = {
            "L1 hit / bare, ingress ids (target >= 1.0)": rps["gateway L1 hit (ingress ids)"]
            / rps["bare aiohttp (ingress ids)"],
            "L1 hit / bare, same bytes": rps["gateway L1 hit (same bytes)"]
            / rps["bare aiohttp (same bytes)"],
            "L2 hit / L1 hit, ingress ids (target >= 0.7)": rps["gateway L2 hit (ingress ids)"]
            / rps["gateway L1 hit (ingress ids)"],
        }
        for name, ratio in ratios.items():
            print(f"{name}: {ratio:.2f}x")
        payload[f"workers_{workers}"] = {"results": results, "ratios": ratios}
    print(f"results: {write_results('gateway_hit', payload)}")


if __name__ == "__main__":
    main()
