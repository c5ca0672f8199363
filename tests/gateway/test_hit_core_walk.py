"""Purges and expiry against the hit core, as a random walk on real sockets and real tiers (gateway/hits).

A request for an entry that was purged (by key or by tenant tag) or has expired is always a miss filled upstream,
never a hit, on either lane and every tier set. Shares the caller-echo upstream of `test_hit_core`.
"""

from __future__ import annotations

import random

import orjson
import pytest

from harness.gateway import FakeClock
from tests.gateway.conftest import GatewayFactory
from tests.gateway.test_hit_core import (
    QUESTIONS,
    TIER_SETS,
    CallerEcho,
    cache_for,
    cluster,
    converse,
    echo_url,
    post,
)

__all__ = ["cluster", "echo_url"]  # fixtures, shared

ADMIN_TOKEN = "core-admin-token"


@pytest.mark.parametrize("tiers", TIER_SETS)
async def test_purged_and_expired_entries_are_never_served_on_any_lane(
    make_gateway: GatewayFactory,
    echo_url: tuple[CallerEcho, str],
    request: pytest.FixtureRequest,
    clock: FakeClock,
    tiers: str,
) -> None:
    """A random walk of requests (3 callers x 4 questions, whole or split, ingress ids or not), purges by key
    and by tenant tag, and TTL expiry: a request for an entry that was purged or has expired is always a miss
    filled upstream, never a hit, on either lane and every tier set."""
    _, url = echo_url
    ttl_s = 60
    gw = await make_gateway(
        url,
        cache=cache_for(tiers, request),
        server={"admin_token": ADMIN_TOKEN},
        routes={"chat/completions": {"ttl_s": ttl_s}},
    )
    port = gw.server.port
    assert port is not None
    rng = random.Random(f"purge-walk-{tiers}")
    callers, questions = range(3), QUESTIONS[:4]
    stored: dict[tuple[int, str], str] = {}  # (caller, question) -> its key, while an entry should answer
    tags: dict[int, str] = {}  # caller -> its tenant tag
    served = {"hit": 0, "fwd=miss": 0}
    for _ in range(300):
        op = rng.random()
        if op < 0.75:
            caller, question = rng.choice(callers), rng.choice(questions)
            data = post(question, caller, ingress=rng.random() < 0.5)
            cuts = [[rng.randrange(1, len(data))]] if rng.random() < 0.3 else [[]]
            (reply,) = await converse(port, [[data]], cuts)
            assert reply.status == 200 and reply.content() == f"for Bearer caller-{caller} :: {question}"
            status = reply.headers["cache-status"].split(";")[1].strip()
            if (caller, question) not in stored:
                assert status == "fwd=miss", (tiers, caller, question)  # never a purged or expired entry
            served[status] += 1
            stored[(caller, question)] = reply.headers["x-cache-key"]
            tags[caller] = "tenant:" + reply.headers["x-cache-key"].split(":")[1]
        elif op < 0.85 and stored:
            target = rng.choice(sorted(stored))
            await purge(port, {"keys": [stored.pop(target)]})
        elif op < 0.95 and tags:
            caller = rng.choice(sorted(tags))
            await purge(port, {"tags": [tags[caller]]})
            stored = {k: v for k, v in stored.items() if k[0] != caller}
        else:
            clock.advance(ttl_s + 1)
            stored.clear()
    assert served["hit"] > 50 and served["fwd=miss"] > 20  # the walk exercised both


async def purge(port: int, doc: dict[str, list[str]]) -> None:
    body = orjson.dumps(doc)
    data = (
        f"POST /admin/purge HTTP/1.1\r\nHost: gateway.test\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    (reply,) = await converse(port, [[data]], [[]])
    assert reply.status == 200, reply.body
