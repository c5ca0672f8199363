"""Soak: N unique requests through one gateway process with L1 at 64 MiB and the request memo at its default,
sampling the process's RSS as it goes. The bound checked: RSS <= baseline + L1 budget + memo budget + 15%.

Baseline is the RSS after a warm-up of 1,000 requests (imports, buffers, connection pools; the warm-up entries
stay in L1 and the memo, so the baseline slightly overstates the fixed part). Every request is unique, so every
one is a miss that stores an entry: the worst case for both budgets.

`python -m bench soak [requests]` (default 200,000; the test suite runs the short in-process version).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from bench.measure.load import write_results
from gateway.state import GatewayState
from harness.processes import PYTHON, free_port, server

L1_BYTES = 64 << 20
CONCURRENCY = 32
SAMPLES = 20


def memo_budget() -> int:
    return int(GatewayState.__dataclass_fields__["memo"].default_factory().max_bytes)  # type: ignore[misc]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def drive(url: str, start: int, count: int) -> int:
    """Send `count` unique requests (ids start..start+count) with CONCURRENCY in flight; returns errors."""
    errors = 0
    next_id = start
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:

        async def worker() -> None:
            nonlocal next_id, errors
            while next_id < start + count:
                n, next_id = next_id, next_id + 1
                body = {
                    "model": "bench-model",
                    "temperature": 0,
                    "messages": [{"role": "user", "content": f"soak question number {n}, answer briefly"}],
                }
                async with session.post(
                    url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer soak"}
                ) as resp:
                    await resp.read()
                    errors += resp.status != 200

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return errors


def main(argv: list[str]) -> None:
    total = int(argv[0]) if argv else 200_000
    up_port, gw_port = free_port(), free_port()
    env = {
        "TOKENEDGE_UPSTREAM_URL": f"http://127.0.0.1:{up_port}",
        "TOKENEDGE_CACHE_L1_MAX_BYTES": str(L1_BYTES),
    }
    curve: list[dict[str, float]] = []
    with (
        server(
            [PYTHON, "-m", "harness.peers.servers", "upstream", str(up_port)],
            f"http://127.0.0.1:{up_port}/health",
        ),
        server(
            [PYTHON, "-m", "gateway", "--port", str(gw_port)], f"http://127.0.0.1:{gw_port}/health", env
        ) as gw,
    ):
        url = f"http://127.0.0.1:{gw_port}"
        errors = asyncio.run(drive(url, 0, 1_000))
        baseline = rss_bytes(gw.pid)
        step = total // SAMPLES
        started = time.monotonic()
        for i in range(SAMPLES):
            errors += asyncio.run(drive(url, 1_000 + i * step, step))
            curve.append(
                {
                    "requests": (i + 1) * step,
                    "rss_mib": rss_bytes(gw.pid) / 2**20,
                    "elapsed_s": time.monotonic() - started,
                }
            )
    bound = baseline + (L1_BYTES + memo_budget()) * 1.15
    peak = max(point["rss_mib"] for point in curve) * 2**20
    print(
        f"soak: {total:,} unique requests, L1 {L1_BYTES >> 20} MiB, memo {memo_budget() >> 20} MiB, "
        f"{errors} errors"
    )
    print(
        f"baseline RSS {baseline / 2**20:.1f} MiB; bound {bound / 2**20:.1f} MiB; peak {peak / 2**20:.1f} MiB "
        f"-> {'OK' if peak <= bound else 'OVER'}"
    )
    print(f"{'requests':>10} {'RSS MiB':>8} {'s':>6}")
    for point in curve:
        print(f"{int(point['requests']):>10,} {point['rss_mib']:>8.1f} {point['elapsed_s']:>6.0f}")
    write_results(
        "soak",
        {"baseline_mib": baseline / 2**20, "bound_mib": bound / 2**20, "curve": curve, "errors": errors},
    )
