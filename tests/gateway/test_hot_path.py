"""Regression guard for the hit path, by counting work rather than timing it.

An L1 hit makes no upstream call, no Redis command and no JSON (de)serialization; an L2 hit costs exactly one
Redis command, or exactly one Memcached round trip (counted by a proxy in front of a real memcached). If a change makes the hit path heavier in these terms, this fails on any machine, however noisy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import redis

from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import RunningGateway
from tests.support.mc_proxy import CountingProxy
from tests.support.services import MemcachedServer, RedisServer

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


@dataclass
class HitWork:
    """What one warm hit cost: its response, upstream calls, Redis commands (net of the counter's own INFO)
    and JSON (de)serializations."""

    cache_status: str
    upstream_calls: int
    redis_commands: int
    json_calls: Counter[str]


async def warm_hit_work(gw: RunningGateway, fake: FakeUpstream, redis_server: RedisServer,
                        monkeypatch: pytest.MonkeyPatch) -> HitWork:
    for _ in range(2):  # a miss that stores, then a hit that warms the memo and the header block
        await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
    upstream_before = sum(fake.calls.values())
    counter = CommandCounter(redis_server)
    commands_before = counter.read()
    with counting_json(monkeypatch) as json_calls:
        resp = await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
        await resp.read()
    commands = counter.read() - commands_before - 1  # minus the INFO call that read the counter
    counter.close()
    return HitWork(resp.headers["Cache-Status"], sum(fake.calls.values()) - upstream_before, commands, json_calls)


async def test_l1_hit_makes_no_upstream_call_no_redis_command_and_no_json_work(
        make_gateway: GatewayFactory, fake: FakeUpstream, redis_server: RedisServer, redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url})
    work = await warm_hit_work(gw, fake, redis_server, monkeypatch)
    assert work.cache_status.endswith("detail=l1")
    assert work.upstream_calls == 0
    assert work.redis_commands == 0
    assert work.json_calls == Counter()


async def test_l2_hit_costs_exactly_one_redis_command(make_gateway: GatewayFactory, fake: FakeUpstream,
                                                      redis_server: RedisServer, redis_url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0})
    work = await warm_hit_work(gw, fake, redis_server, monkeypatch)
    assert work.cache_status.endswith("detail=l2")
    assert work.upstream_calls == 0
    assert work.redis_commands == 1  # the (batched) GET
    # Decoding an L2 entry parses its small header; the body itself is never re-serialized.
    assert work.json_calls["dumps"] == 0
    assert work.json_calls["loads"] <= 1


async def test_l2_hit_costs_exactly_one_memcached_round_trip(make_gateway: GatewayFactory, fake: FakeUpstream,
                                                             memcached: MemcachedServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = CountingProxy(memcached.port)
    port = await proxy.start()
    try:
        gw = await make_gateway(cache={"l2": "memcached", "memcached_servers": [f"127.0.0.1:{port}"],
                                       "memcached_l1_max_age_s": 0})  # L1 off: every hit comes from Memcached
        for _ in range(2):
            await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
        before, upstream_before = Counter(proxy.commands), sum(fake.calls.values())
        with counting_json(monkeypatch) as json_calls:
            resp = await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
            await resp.read()
        commands = proxy.commands - before
    finally:
        await proxy.close()
    assert resp.headers["Cache-Status"].endswith("detail=l2")
    assert sum(fake.calls.values()) == upstream_before
    # One `get` carries the entry and the version counters of all its tags: the tag check costs no round trip.
    assert sum(commands.values()) == 1
    assert set(commands) <= {"get", "gets"}  # aiomcache's multi_get sends `gets`
    assert proxy.keys_per_get[-1] == 1 + 4  # the entry, its tenant:/key: counters, its model:/rev: counters
    assert json_calls["dumps"] == 0
    assert json_calls["loads"] <= 1
