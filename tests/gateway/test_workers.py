"""`python -m gateway --workers 2`: /metrics and /dashboard/data on any worker report the totals of both.

Proof that both workers served, without a per-process label: the same request is sent N times, one fresh
connection each, sequentially. L1 is per process, so each worker misses it exactly once: two misses (and two
upstream calls) mean two workers answered, and hits + misses == N means no request went uncounted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from harness.workers import gateway_workers
from tests.gateway.conftest import AUTH_A, CHAT
from tests.gateway.test_metrics import parse, value
from tests.support.fake_upstream import FakeUpstream

N = 24
WORKERS = 2


@pytest.fixture
async def workers(upstream_url: str) -> AsyncIterator[str]:
    async with gateway_workers(upstream_url, WORKERS) as url:
        yield url


async def test_totals_across_two_workers_equal_requests_sent(workers: str, fake: FakeUpstream) -> None:
    for _ in range(N):  # a fresh connection each time, so the kernel spreads them over both workers
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(f"{workers}/v1/chat/completions", json=CHAT, headers=AUTH_A) as resp,
        ):
            assert resp.status == 200
            await resp.read()
    # Each worker folds its hot-path tallies into the shared files at least once a second (gateway/ops/tally.py):
    # poll (bounded) until the other worker's last second has landed.
    m = {}
    for _ in range(50):
        async with aiohttp.ClientSession() as session, session.get(f"{workers}/metrics") as resp:
            m = parse(await resp.text())
        if value(m, "tokenedge_requests_total") >= N:
            break
        await asyncio.sleep(0.1)

    assert value(m, "tokenedge_requests_total") == N
    assert value(m, "tokenedge_request_duration_seconds_count") == N
    misses = value(m, "tokenedge_requests_total", result="miss")
    assert misses + value(m, "tokenedge_requests_total", result="hit") == N
    assert misses == fake.calls["chat"] == WORKERS  # each worker's own L1 missed once: both served
    assert value(m, "tokenedge_cache_lookups_total", tier="l1", outcome="miss") == WORKERS
    assert value(m, "tokenedge_tokens_saved_total") == (N - WORKERS) * 15
    # L1 gauges are livesum over workers, each refreshed by its own worker every second: poll until both report
    entries = 0.0
    for _ in range(50):
        async with aiohttp.ClientSession() as session, session.get(f"{workers}/metrics") as resp:
            entries = value(parse(await resp.text()), "tokenedge_cache_entries", tier="l1")
        if entries == WORKERS:
            break
        await asyncio.sleep(0.1)
    assert entries == WORKERS  # one entry in each worker's L1

    # The dashboard: its window totals come from the same merged counters, its hot keys from both workers' tables
    # (each saved once a second when it changed): poll until the other worker's table has landed.
    data: dict[str, object] = {}
    for _ in range(50):
        async with aiohttp.ClientSession() as session, session.get(f"{workers}/dashboard/data") as resp:
            data = await resp.json()
        if data["top_keys"] and data["top_keys"][0]["hits"] == N - WORKERS:  # type: ignore[index]
            break
        await asyncio.sleep(0.1)
    assert [row["hits"] for row in data["top_keys"]] == [N - WORKERS]  # type: ignore[union-attr, index]
    assert sum(data["window"]["totals"]["requests"].values()) == N  # type: ignore[index, union-attr]
