"""Benchmark: gateway L1-hit throughput against a bare aiohttp app returning the same bytes (issue 2's check).

Same run, same load tool (wrk), same worker count, same request bytes; the ratio is what counts.
`python -m bench gateway_hit [--workers N] [--duration S] [--repeats R]`. The full suite is `bench gateway`.
"""

from __future__ import annotations

import argparse
import urllib.request
from contextlib import ExitStack

from bench.harness import (
    PYTHON,
    LoadResult,
    free_port,
    median_result,
    print_table,
    server,
    write_results,
    wrk,
)
from bench.peers import bare_aiohttp

REQUEST = (
    b'{"model":"bench-model","temperature":0,"max_tokens":64,'
    b'"messages":[{"role":"system","content":"You are terse."},'
    b'{"role":"user","content":"What is the capital of France?"}]}'
)
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench-tenant"}


def post(url: str, body: bytes = REQUEST, headers: dict[str, str] = HEADERS) -> tuple[bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read(), dict(resp.headers)


def run(workers: int, duration_s: int, repeats: int, connections: int) -> dict[str, LoadResult]:
    with ExitStack() as stack:
        up_port, gw_port = free_port(), free_port()
        stack.enter_context(
            server(
                [PYTHON, "-m", "bench.servers", "upstream", str(up_port)],
                f"http://127.0.0.1:{up_port}/health",
            )
        )
        gw = stack.enter_context(
            server(
                [PYTHON, "-m", "gateway", "--workers", str(workers), "--port", str(gw_port)],
                f"http://127.0.0.1:{gw_port}/health",
                env={"TOKENEDGE_UPSTREAM_URL": f"http://127.0.0.1:{up_port}"},
            )
        )
        gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        hit_body = b""
        for _ in range(50):  # each worker has its own L1: post until one answers with a hit
            hit_body, hit_headers = post(gw_url)
            if hit_headers.get("Cache-Status", "").startswith("tokenedge; hit"):
                break
        else:
            raise RuntimeError("no cache hit after 50 identical requests")
        bare_url, bare_pids = stack.enter_context(bare_aiohttp(hit_body, workers))
        for url in (gw_url, bare_url):  # warm-up: workers primed, connections established
            for _ in range(workers * 4):
                post(url)
        runs: dict[str, list[LoadResult]] = {"gateway L1 hit": [], "bare aiohttp (same bytes)": []}
        for _ in range(repeats):  # interleaved, so machine noise hits both alike
            runs["gateway L1 hit"].append(
                wrk(
                    gw_url,
                    body=REQUEST,
                    headers=HEADERS,
                    duration_s=duration_s,
                    connections=connections,
                    threads=1,
                    pids=[gw.pid],
                )
            )
            runs["bare aiohttp (same bytes)"].append(
                wrk(
                    bare_url,
                    body=REQUEST,
                    headers=HEADERS,
                    duration_s=duration_s,
                    connections=connections,
                    threads=1,
                    pids=bare_pids,
                )
            )
        return {name: median_result(results) for name, results in runs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench gateway_hit", description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args(argv)
    payload: dict[str, object] = {}
    for workers in args.workers:
        results = run(workers, args.duration, args.repeats, args.connections)
        print_table(
            f"L1 hit vs bare aiohttp, {workers} worker(s), wrk -t1 -c{args.connections} "
            f"-d{args.duration}s, median of {args.repeats}",
            list(results.items()),
            "bare aiohttp (same bytes)",
        )
        ratio = results["gateway L1 hit"].rps / results["bare aiohttp (same bytes)"].rps
        print(f"ratio gateway/bare = {ratio:.2f}x (target >= 0.90x)")
        payload[f"workers_{workers}"] = {"results": results, "ratio": ratio}
    print(f"results: {write_results('gateway_hit', payload)}")


if __name__ == "__main__":
    main()
