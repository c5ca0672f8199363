"""Many upstreams, end to end with real processes on loopback: three fake prefix-cache backends
(harness/prefix_backend.py, each its own process with a bounded LRU prefix cache) behind one gateway process.

20 conversations x 5 turns with 4 shared system prompts, turn by turn (harness/conversations.py): prefix
affinity through the gateway must at least double the prefix-hit tokens of direct round-robin over the same
backends (request n to backend n % 3), keep every backend within 1.5x the mean load, and, with one backend
SIGKILLed mid-run, lose no client request (the retry on another backend, then its ejection).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.conversations import BackendProc, post_chat, prefix_backends, run_conversations, stats
from harness.replicas import Replica, start_replica, stop_replica

CONVERSATIONS, TURNS = 20, 5
# Caches big enough for the whole workload on every backend (8192 blocks of 16 characters; the workload is ~70k
# characters): round-robin loses nothing to eviction, so the gain measured is affinity's alone.
BACKEND_ARGS = ("--capacity", "8192", "--prefill-us", "20", "--base-ms", "10")


@pytest.fixture
async def backends() -> AsyncIterator[list[BackendProc]]:
    async with prefix_backends(3, *BACKEND_ARGS) as started:
        yield started


async def _gateway(backends: list[BackendProc], **env: str) -> Replica:
    return await start_replica(
        ",".join(b.url for b in backends),
        {"TOKENEDGE_UPSTREAM_HEALTH_INTERVAL_S": "0.2", "TOKENEDGE_UPSTREAM_CONNECT_TIMEOUT_S": "0.5", **env},
    )


async def test_prefix_affinity_doubles_prefix_hits_over_round_robin_within_the_load_bound(
    backends: list[BackendProc],
) -> None:
    async with aiohttp.ClientSession() as session:
        turn = itertools.count()
        direct = await run_conversations(
            lambda c, t, m: post_chat(session, backends[next(turn) % 3].url, m), CONVERSATIONS, TURNS
        )
        round_robin = await stats(session, backends)
        await stats(session, backends, reset=True)
        gw = await _gateway(backends)
        try:
            routed = await run_conversations(
                lambda c, t, m: post_chat(session, gw.url, m), CONVERSATIONS, TURNS
            )
        finally:
            await stop_replica(gw)
        affine = await stats(session, backends)
    assert direct.failures == [] and routed.failures == []
    assert sum(s["requests"] for s in affine) == CONVERSATIONS * TURNS  # every turn a miss, none retried
    rr_hits, affine_hits = sum(s["hit_tokens"] for s in round_robin), sum(s["hit_tokens"] for s in affine)
    print(
        f"prefix-hit tokens: round-robin {rr_hits}, affinity {affine_hits}; loads {[s['requests'] for s in affine]}"
    )
    assert affine_hits >= 2 * rr_hits
    mean = CONVERSATIONS * TURNS / 3
    assert max(s["requests"] for s in affine) <= 1.5 * mean


async def test_a_backend_killed_mid_run_fails_no_client_request(backends: list[BackendProc]) -> None:
    gw = await _gateway(backends)
    victim = backends[1]

    async def kill_midway(done: int) -> None:
        if done == CONVERSATIONS * TURNS // 3:
            victim.kill()

    try:
        async with aiohttp.ClientSession() as session:
            result = await run_conversations(
                lambda c, t, m: post_chat(session, gw.url, m), CONVERSATIONS, TURNS, after=kill_midway
            )
            survivors = await stats(session, backends)
            async with session.get(gw.url + "/metrics") as resp:
                metrics = await resp.text()
    finally:
        await stop_replica(gw)
    assert victim.proc.returncode is not None  # it was killed while requests were in flight
    assert result.failures == []
    assert result.completed == CONVERSATIONS * TURNS
    assert sum(s["requests"] for s in survivors) > 0
    retried = _sample(metrics, "tokenedge_backend_requests_total", backend=victim.url, outcome="retried")
    ejected = _sample(metrics, "tokenedge_backend_ejections_total", backend=victim.url)
    assert retried >= 1 and ejected >= 1  # the failures were retried elsewhere, and the dead backend ejected


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0
