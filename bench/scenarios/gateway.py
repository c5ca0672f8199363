"""Benchmark suite for the gateway (issue 8): L1 hit, L2 hit (Redis, and Memcached through aiocache), miss and
bypass, side by side with bare aiohttp and nginx returning the same bytes and the LiteLLM proxy with its cache (local, then Redis), at 1 and 2 workers.

Every system gets the same request bytes and the same zero-latency upstream. `python -m bench gateway`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from bench.measure.hits import HEADERS, REQUEST, Target, measure, prime, redis_server
from bench.measure.load import LoadResult, print_table, write_results
from harness.peers.gateways import LITELLM_MASTER_KEY, bare_aiohttp, litellm_proxy, nginx_fixed
from harness.processes import PYTHON, free_port, server
from harness.services import MemcachedServer

BYPASS_REQUEST = REQUEST.replace(b'"temperature":0', b'"temperature":0.7')
MISS_REQUEST = REQUEST.replace(b"What is the capital", b"__UNIQUE__ What is the capital")


@contextmanager
def memcached_server() -> Iterator[str]:
    server = MemcachedServer()
    server.start()
    try:
        yield server.server
    finally:
        server.kill()


@contextmanager
def gateway(upstream: str, workers: int, env: dict[str, str]) -> Iterator[tuple[str, list[int]]]:
    port = free_port()
    with server(
        [PYTHON, "-m", "gateway", "--workers", str(workers), "--port", str(port)],
        f"http://127.0.0.1:{port}/health",
        env={"TOKENEDGE_UPSTREAM_URL": upstream, **env},
    ) as proc:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", [proc.pid]


def gateways(
    stack: ExitStack, upstream: str, workers: int, redis_url: str
) -> dict[str, tuple[str, list[int]]]:
    """The three gateways the hit rows compare: L1, L2 on Redis (L1 off), L2 on Memcached (L1 off)."""
    memcached = {
        "TOKENEDGE_CACHE_L2": "memcached",
        "TOKENEDGE_CACHE_MEMCACHED_SERVERS": stack.enter_context(memcached_server()),
        "TOKENEDGE_CACHE_MEMCACHED_L1_MAX_AGE_S": "0",
    }
    envs = {
        "l1": {},
        "l2": {"TOKENEDGE_CACHE_REDIS_URL": redis_url, "TOKENEDGE_CACHE_L1_MAX_BYTES": "0"},
        "mc": memcached,
    }
    return {name: stack.enter_context(gateway(upstream, workers, env)) for name, env in envs.items()}


def run(workers: int, args: argparse.Namespace) -> dict[str, LoadResult]:
    with ExitStack() as stack:
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        stack.enter_context(
            server([PYTHON, "-m", "harness.peers.servers", "upstream", str(up_port)], f"{upstream}/health")
        )
        redis_url = stack.enter_context(redis_server())
        started = gateways(stack, upstream, workers, redis_url)
        (l1_url, l1_pids), (l2_url, l2_pids), (mc_url, mc_pids) = started["l1"], started["l2"], started["mc"]
        hit_body = prime(l1_url)
        bare_url, bare_pids = stack.enter_context(bare_aiohttp(hit_body, workers))
        nginx_url, nginx_pids = stack.enter_context(nginx_fixed(hit_body, workers))
        targets: dict[str, Target] = {}
        for shape, ingress in (("ingress ids", True), ("same bytes", False)):  # realistic traffic first
            targets[f"gateway L1 hit ({shape})"] = (l1_url, l1_pids, REQUEST, HEADERS, ingress)
            targets[f"gateway L2 hit (L1 off, {shape})"] = (l2_url, l2_pids, REQUEST, HEADERS, ingress)
            targets[f"gateway L2 hit (Memcached, L1 off, {shape})"] = (
                mc_url,
                mc_pids,
                REQUEST,
                HEADERS,
                ingress,
            )
            targets[f"bare aiohttp ({shape})"] = (bare_url, bare_pids, REQUEST, HEADERS, ingress)
        targets["gateway miss (unique bodies)"] = (l1_url, l1_pids, MISS_REQUEST, HEADERS, False)
        targets["gateway bypass (temperature 0.7)"] = (l1_url, l1_pids, BYPASS_REQUEST, HEADERS, False)
        targets["nginx (same bytes)"] = (nginx_url, nginx_pids, REQUEST, HEADERS, False)
        litellm_headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {LITELLM_MASTER_KEY}",
        }
        if not args.no_litellm and workers == 1:  # the target is per worker; one LiteLLM start costs ~45 s
            for cache in ("local", "redis"):
                try:
                    url, pids = stack.enter_context(litellm_proxy(upstream, cache, redis_url, workers))
                except RuntimeError as exc:
                    print(f"LiteLLM ({cache}) unavailable: {exc}")
                    continue
                targets[f"LiteLLM proxy hit ({cache} cache)"] = (url, pids, REQUEST, litellm_headers, False)
        return measure(
            targets,
            duration_s=args.duration,
            repeats=args.repeats,
            connections=args.connections,
            warm=4 * workers,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench gateway", description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--duration", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--no-litellm", action="store_true")
    args = parser.parse_args(argv)
    payload: dict[str, object] = {}
    for workers in args.workers:
        results = run(workers, args)
        print_table(
            f"Gateway scenarios, {workers} worker(s), wrk -t1 -c{args.connections} -d{args.duration}s, "
            f"median of {args.repeats} interleaved runs (ratio vs bare aiohttp)",
            list(results.items()),
            "bare aiohttp (ingress ids)",
        )
        summary: dict[str, float] = {}
        for shape in ("ingress ids", "same bytes"):
            l1, l2 = results[f"gateway L1 hit ({shape})"], results[f"gateway L2 hit (L1 off, {shape})"]
            bare = results[f"bare aiohttp ({shape})"]
            l2_mc = results[f"gateway L2 hit (Memcached, L1 off, {shape})"]
            tag = shape.replace(" ", "_")
            summary |= {
                f"l1_vs_bare_{tag}": l1.rps / bare.rps,
                f"l2_vs_l1_{tag}": l2.rps / l1.rps,
                f"l2_memcached_vs_l2_redis_{tag}": l2_mc.rps / l2.rps,
            }
        l1 = results["gateway L1 hit (ingress ids)"]
        for name, result in results.items():
            if name.startswith("LiteLLM"):
                summary[f"l1_vs_{name}"] = l1.rps / result.rps
        print("  " + ", ".join(f"{k} = {v:.2f}x" for k, v in summary.items()))
        payload[f"workers_{workers}"] = {"results": results, "summary": summary}
    print(f"results: {write_results('gateway_suite', payload)}")


if __name__ == "__main__":
    main()
