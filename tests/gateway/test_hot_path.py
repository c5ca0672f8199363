"""Regression guard for the hit path, by counting work rather than timing it.

An L1 hit makes no upstream call, no Redis command and no JSON (de)serialization; an L2 hit costs exactly one
Redis command, or exactly one Memcached round trip (counted by a proxy in front of a real memcached). If a change makes the hit path heavier in these terms, this fails on any machine, however noisy.
A warm L1 hit also takes the fast lane (gateway/edge/fastlane.py): no parsing, policy, scope hash, key derivation,
header dict or aiohttp header assembly. Calls are counted with `sys.setprofile`, so no import style hides one.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import orjson
import redis

from harness.gateway import RunningGateway
from harness.services import MemcachedServer, RedisServer
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tests.support.mc_proxy import CountingProxy

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


_JSON_DIR = os.path.dirname(json.__file__) + os.sep


@contextmanager
def counting_calls() -> Iterator[Counter[str]]:
    """Every call this thread makes while inside, by `module:qualname`, through `sys.setprofile`.

    Patching `orjson.loads` on the module would miss `from orjson import loads` or a stdlib `json.loads`; the
    profile hook sees every Python call and every call of the orjson C functions, however they were imported.
    The in-process server and the test client share the thread, so server work is counted (and client work too:
    the assertions only name server-side functions, or JSON, which the test client never calls on a `read()`).
    """
    counts: Counter[str] = Counter()
    orjson_fns = {id(orjson.loads): "orjson.loads", id(orjson.dumps): "orjson.dumps"}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(_JSON_DIR):
                counts[f"json.{code.co_name}"] += 1  # stdlib json, any entry point (loads, JSONDecoder, ...)
            else:
                counts[f"{frame.f_globals.get('__name__')}:{code.co_qualname}"] += 1
        elif event == "c_call" and (name := orjson_fns.get(id(arg))) is not None:
            counts[name] += 1

    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(None)


def json_work(calls: Counter[str]) -> Counter[str]:
    return Counter({name: n for name, n in calls.items() if name.startswith(("json.", "orjson."))})


@dataclass
class HitWork:
    """What one warm hit cost: its response, upstream calls, Redis commands (net of the counter's own INFO),
    JSON (de)serializations (orjson and stdlib) and every Python call by name."""

    cache_status: str
    upstream_calls: int
    redis_commands: int
    json_calls: Counter[str]
    calls: Counter[str]


async def warm_hit_work(gw: RunningGateway, fake: FakeUpstream, redis_server: RedisServer) -> HitWork:
    for _ in range(2):  # a miss that stores, then a hit that warms the memo and the header block
        await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
    upstream_before = sum(fake.calls.values())
    counter = CommandCounter(redis_server)
    commands_before = counter.read()
    with counting_calls() as calls:
        resp = await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
        await resp.read()
    commands = counter.read() - commands_before - 1  # minus the INFO call that read the counter
    counter.close()
    return HitWork(
        resp.headers["Cache-Status"],
        sum(fake.calls.values()) - upstream_before,
        commands,
        json_work(calls),
        calls,
    )


async def test_l1_hit_makes_no_upstream_call_no_redis_command_and_no_json_work(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_server: RedisServer, redis_url: str
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url})
    work = await warm_hit_work(gw, fake, redis_server)
    assert work.cache_status.endswith("detail=l1")
    assert work.upstream_calls == 0
    assert work.redis_commands == 0
    assert work.json_calls == Counter()


# What the fast path exists to skip, by name: parsing, policy, scope hashing, key derivation, the header dict,
# aiohttp's header assembly and the response-prepare signal.
SKIPPED_ON_THE_FAST_PATH = (
    "gateway.keys.validate:parse_object",
    "gateway.handlers.completions:prepare",
    "gateway.keys.policy:decide",
    "gateway.keys.derive:tenant_scope",
    "gateway.keys.derive:derive_key_from_bytes",
    "gateway.hits.headers:entry_headers",
    "gateway.handlers.ops:on_response_prepare",
    "aiohttp.web_response:StreamResponse._prepare_headers",
    "aiohttp.web_response:StreamResponse._write_headers",
    "aiohttp.web_response:Response.__init__",
)


async def test_l1_hit_takes_the_fast_path_and_skips_the_response_layer(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_server: RedisServer, redis_url: str
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url})
    work = await warm_hit_work(gw, fake, redis_server)
    # Served by the fast lane from the connection's read (gateway/edge/fastlane.py): no aiohttp request object, router,
    # middleware or response object; the key bound from this request's own headers.
    assert work.calls["gateway.edge.fastlane:FastLane.take"] == 1
    assert work.calls["gateway.edge.fastlane:keyed"] == 1
    assert work.calls["gateway.hits.record:hit"] == 1
    never = (
        "aiohttp.web_app:Application._make_request",
        "aiohttp.web_request:BaseRequest.__init__",
        "aiohttp.web_urldispatcher:UrlDispatcher.resolve",
        "gateway.app:error_middleware",
        "gateway.handlers.completions:make_handler.<locals>.handler",
        *SKIPPED_ON_THE_FAST_PATH,
    )
    assert {name: work.calls[name] for name in never} == dict.fromkeys(never, 0)
    # Still one L1 read and one policy freshness check: the fast path does not skip the cache itself.
    assert work.calls["gateway.tiers.memory:MemoryTier.get"] == 1
    assert work.calls["gateway.keys.policy:freshness"] == 1


def test_the_json_guard_sees_stdlib_and_aliased_imports() -> None:
    from json import loads as stdlib_loads

    from orjson import dumps as aliased_dumps

    with counting_calls() as calls:
        stdlib_loads("{}")
        json.JSONDecoder().decode("[]")
        aliased_dumps({})
    work = json_work(calls)
    assert work["orjson.dumps"] == 1
    assert work["json.loads"] == 1 and work["json.decode"] >= 2


async def test_l2_hit_costs_exactly_one_redis_command(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_server: RedisServer, redis_url: str
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0})
    work = await warm_hit_work(gw, fake, redis_server)
    assert work.cache_status.endswith("detail=l2")
    assert work.upstream_calls == 0
    assert work.redis_commands == 1  # the (batched) GET
    # Served by the fast lane: the known key read from L2 (a callback on the batched read) and written as bytes,
    # nothing re-derived, no aiohttp request object.
    assert work.calls["gateway.edge.fastlane:FastLane._l2_read"] == 1
    assert work.calls["aiohttp.web_request:BaseRequest.__init__"] == 0
    assert {name: work.calls[name] for name in SKIPPED_ON_THE_FAST_PATH} == dict.fromkeys(
        SKIPPED_ON_THE_FAST_PATH, 0
    )
    # Decoding an L2 entry parses its small header (one orjson.loads); the body itself is never re-serialized.
    assert work.json_calls - Counter({"orjson.loads": 1}) == Counter()


async def test_l2_hit_costs_exactly_one_memcached_round_trip(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    proxy = CountingProxy(memcached.port)
    port = await proxy.start()
    try:
        gw = await make_gateway(
            cache={"l2": "memcached", "memcached_servers": [f"127.0.0.1:{port}"], "memcached_l1_max_age_s": 0}
        )  # L1 off: every hit comes from Memcached
        for _ in range(2):
            await gw.client.post("/v1/chat/completions", data=RAW, headers=HEADERS)
        before, upstream_before = Counter(proxy.commands), sum(fake.calls.values())
        with counting_calls() as calls:
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
    assert json_work(calls) - Counter({"orjson.loads": 1}) == Counter()
