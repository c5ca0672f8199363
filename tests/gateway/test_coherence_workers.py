"""`python -m gateway --workers 2` processes stay coherent: without Redis through the parent's relay, and with
Redis together with a second, separate gateway process on the same Redis (a replica).

Each request goes on a fresh connection so the kernel spreads them over the workers. The entry is first warmed
into every L1 (each worker misses once, then hits), then purged through one process; no later answer may be the
purged one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import orjson

from harness.workers import gateway_workers
from tests.gateway.conftest import AUTH_A, CHAT
from tests.support.fake_upstream import FakeUpstream

REPO = Path(__file__).resolve().parents[2]
ADMIN = {"Authorization": "Bearer admin-secret"}


def gateway_process(upstream_url: str, workers: int, redis_url: str = "") -> AbstractAsyncContextManager[str]:
    """`python -m gateway --workers N` with the admin token (and Redis when given)."""
    env = {"TOKENEDGE_SERVER_ADMIN_TOKEN": "admin-secret", "TOKENEDGE_CACHE_REDIS_URL": redis_url}
    return gateway_workers(upstream_url, workers, env)


async def post(
    url: str, path: str, body: object, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.post(url + path, json=body, headers=headers) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


async def until_l1_everywhere(urls: list[str], fake: FakeUpstream) -> tuple[bytes, str]:
    """Ask until processes answer from their own L1 (bounded); returns the cached answer and its key."""
    answers: set[bytes] = set()
    l1_hits = 0
    for i in range(200):
        _, headers, body = await post(urls[i % len(urls)], "/v1/chat/completions", CHAT, AUTH_A)
        answers.add(body)
        l1_hits += headers["Cache-Status"].endswith("detail=l1")
        if l1_hits >= 8:
            break
    assert len(answers) <= 2 and l1_hits >= 8
    _, headers, body = await post(urls[0], "/v1/chat/completions", CHAT, AUTH_A)
    return body, headers["X-Cache-Key"]


async def purge_then_no_old_answers(
    urls: list[str], fake: FakeUpstream, purge: str, confirmed: Callable[[int], bool], requests: int
) -> None:
    old, key = await until_l1_everywhere(urls, fake)
    body = {"keys": [key]} if purge == "key" else {"tags": [purge]}
    status, _, raw = await post(urls[0], "/admin/purge", body, ADMIN)
    assert status == 200
    assert confirmed(orjson.loads(raw)["purged"]["bus"])
    for i in range(requests):
        _, headers, answer = await post(urls[i % len(urls)], "/v1/chat/completions", CHAT, AUTH_A)
        assert answer != old, f"request {i}: purged entry served ({headers['Cache-Status']})"


async def test_workers_without_redis_relay_purges(upstream_url: str, fake: FakeUpstream) -> None:
    async with gateway_process(upstream_url, 2) as url:
        await purge_then_no_old_answers([url], fake, "model:test-model", lambda n: n == 1, 60)


async def test_workers_and_a_replica_on_one_redis(
    upstream_url: str, fake: FakeUpstream, redis_url: str
) -> None:
    async with (
        gateway_process(upstream_url, 2, redis_url) as one,
        gateway_process(upstream_url, 1, redis_url) as two,
    ):
        for purge in ("key", "model:test-model"):
            await purge_then_no_old_answers([one, two], fake, purge, lambda n: n == 2, 60)
