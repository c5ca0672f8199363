"""Benchmark: this tree's gateway against another tree's (a before/after of one change), in the same run.

On a shared, noisy machine only same-run ratios mean anything, so both gateways and bare aiohttp are up at once
and measured in alternating rounds (wrk, same bytes, same settings); the table is the median of the rounds.
`python -m bench gateway_ab --before DIR [--scenario l1|l2] [--workers N] [--ingress] [--tracing RATE]`, where DIR
holds another checkout, e.g. `git archive main | tar -x -C DIR` (or this one: `--before . --tracing 0.01` measures
tracing's cost). `l2` runs both with L1 off on one Redis (an L2 hit per request).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.measure.hits import HEADERS, REQUEST, prime, redis_server
from bench.measure.load import LoadResult, median_result, print_table, write_results, wrk
from harness.peers.gateways import bare_aiohttp
from harness.processes import PYTHON, ROOT, free_port, server, wait_http

BARE = "bare aiohttp"


@contextmanager
def gateway_from(tree: Path, upstream: str, workers: int, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A gateway run from `tree` (its own modules: cwd and PYTHONPATH are the tree)."""
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "gateway", "--workers", str(workers), "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(tree), "TOKENEDGE_UPSTREAM_URL": upstream, **env},
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 30.0)
        yield f"http://127.0.0.1:{port}/v1/chat/completions", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(args: argparse.Namespace) -> dict[str, LoadResult]:
    with ExitStack() as stack:
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        stack.enter_context(
            server([PYTHON, "-m", "harness.peers.servers", "upstream", str(up_port)], f"{upstream}/health")
        )
        env: dict[str, str] = {}
        if args.scenario == "l2":
            env = {"TOKENEDGE_CACHE_REDIS_URL": stack.enter_context(redis_server())}
            env["TOKENEDGE_CACHE_L1_MAX_BYTES"] = "0"
        after_env = dict(env)
        if (
            args.tracing is not None
        ):  # the after gateway traces at this rate into a collector that keeps nothing
            sink_port = free_port()
            sink = f"http://127.0.0.1:{sink_port}"
            stack.enter_context(
                server([PYTHON, "-m", "harness.peers.servers", "sink", str(sink_port)], f"{sink}/health")
            )
            after_env |= {
                "TOKENEDGE_TRACING_ENABLED": "true",
                "TOKENEDGE_TRACING_SAMPLE_RATE": str(args.tracing),
                "TOKENEDGE_TRACING_ENDPOINT": sink,
            }
        targets: dict[str, tuple[str, list[int]]] = {}
        for name, tree, tree_env in (
            ("after (this tree)", ROOT, after_env),
            ("before", Path(args.before).resolve(), env),
        ):
            url, pid = stack.enter_context(gateway_from(tree, upstream, args.workers, tree_env))
            hit_body = prime(url)
            targets[f"gateway {args.scenario} hit, {name}"] = (url, [pid])
        bare_url, bare_pids = stack.enter_context(bare_aiohttp(hit_body, args.workers))
        targets[BARE] = (bare_url, bare_pids)
        runs: dict[str, list[LoadResult]] = {name: [] for name in targets}
        for i in range(args.repeats):
            order = list(targets.items()) if i % 2 == 0 else list(reversed(targets.items()))
            for name, (url, pids) in order:
                result = wrk(
                    url,
                    body=REQUEST,
                    headers=HEADERS,
                    duration_s=args.duration,
                    connections=args.connections,
                    threads=1,
                    pids=pids,
                    ingress=args.ingress,
                )
                runs[name].append(result)
        names = list(targets)
        ratios = [a.rps / b.rps for a, b in zip(runs[names[0]], runs[names[1]], strict=True)]
        print(f"after/before per round: {', '.join(f'{r:.2f}' for r in ratios)}")
        print(f"median after/before = {statistics.median(ratios):.2f}x")
        return {name: median_result(results) for name, results in runs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench gateway_ab", description=__doc__)
    parser.add_argument("--before", required=True, help="a directory holding the other checkout")
    parser.add_argument("--scenario", choices=("l1", "l2"), default="l1")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--duration", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--ingress", action="store_true", help="a unique X-Request-Id and traceparent per request (realistic)"
    )
    parser.add_argument(
        "--tracing",
        type=float,
        help="the after gateway traces at this sample rate (0-1) into a local collector",
    )
    args = parser.parse_args(argv)
    results = run(args)
    print_table(
        f"{args.scenario} hit, after vs before, {args.workers} worker(s), wrk -t1 -c{args.connections} "
        f"-d{args.duration}s, median of {args.repeats} alternating rounds",
        list(results.items()),
        BARE,
    )
    print(f"results: {write_results('gateway_ab', {'results': results})}")


if __name__ == "__main__":
    main()
