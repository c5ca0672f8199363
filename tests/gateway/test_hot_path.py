"""Regression guard for the hit path, by counting work rather than timing it.

An L1 hit makes no upstream call, no Redis command and no JSON (de)serialization; an L2 hit costs exactly one
Redis command. If a change makes the hit path heavier in these terms, this fails on any machine, however noisy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
import redis

from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tests.support.services import RedisServer

RAW = orjson.dumps(CHAT)
HEADERS = {**AUTH_A, "Content-Type": "application/json"}


class CommandCounter:
    """Reads redis-server's own command counter over one connection (so connection setup is not counted)."""

    def __init__(self, server: RedisServer) -> None:
        self._client = redis.Redis(host="127.0.0.1", port=server.port)
        self.read()

    def read(self) -> int:
        # The counter excludes the INFO being answered, so two reads differ by one INFO plus what happened between.
        return int(self._client.info("stats")["total_commands_processed"])

    def close(self) -> None:
        self._client.close()


@contextmanager
def counting_json(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return counted

    with monkeypatch.context() as patch:
        patch.setattr(orjson, "dumps", wrap("dumps", orjson.dumps))
        patch.setattr(orjson, "loads", wrap("loads", orjson.loads))
        yield counts


async def test_l1_hit_makes_no_upstream_call_no_redis_command_and_no_json_work(
        make_gateway: GatewayFactory, fake: FakeUpstream, redis_server: RedisServer, redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url})
    await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
    await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)  # warm: memo + header block
    upstream_before = sum(fake.calls.values())
    counter = CommandCounter(redis_server)
    commands_before = counter.read()
    with counting_json(monkeypatch) as json_calls:
        resp = await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
        await resp.read()
    commands_after = counter.read()
    counter.close()
    assert resp.headers["Cache-Status"].endswith("detail=l1")
    assert sum(fake.calls.values()) == upstream_before
    assert commands_after - commands_before == 1  # only the INFO call that read the counter
    assert json_calls == Counter()


async def test_l2_hit_costs_exactly_one_redis_command(make_gateway: GatewayFactory, fake: FakeUpstream,
                                                      redis_server: RedisServer, redis_url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0})
    await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
    await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
    upstream_before = sum(fake.calls.values())
    counter = CommandCounter(redis_server)
    commands_before = counter.read()
    with counting_json(monkeypatch) as json_calls:
        resp = await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
        await resp.read()
    commands_after = counter.read()
    counter.close()
    assert resp.headers["Cache-Status"].endswith("detail=l2")
    assert sum(fake.calls.values()) == upstream_before
    assert commands_after - commands_before == 1 + 1  # the GET, plus the INFO call that read the counter
    # Decoding an L2 entry parses its small header; the body itself is never re-serialized.
    assert json_calls["dumps"] == 0
    assert json_calls["loads"] <= 1
