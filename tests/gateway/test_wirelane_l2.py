"""The wire lane's L2 hits (gateway/wirelane.py): a callback on the batched Redis read, later reads held in order.

L1 off, a real Redis: every hit is an L2 read. The wire lane must answer it as the fast lane does, count each read
once (a read it does not serve is handed to the normal path), keep the connection's order while the read is in
flight, and count a client that left meanwhile.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.edge import HEAD
from gateway.tiers.base import L2Unavailable
from gateway.tiers.redis_tier import RedisTier
from tests.gateway.conftest import GatewayFactory
from tests.gateway.test_fastpath import RAW, warm, without_date
from tests.gateway.test_metrics import scrape, value
from tests.gateway.test_wirelane import ONE, Conn, lane, their_connection, until
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import RunningGateway
from tests.support.services import MemcachedServer


async def l2_gateway(make_gateway: GatewayFactory, redis_url: str, **server: object) -> RunningGateway:
    """L1 off: every hit is an L2 read (the wire lane waits on it with a callback)."""
    return await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0}, server=server)


class Gate:
    """Holds the L2 tier's reads until opened (the real Redis read runs; only its answer waits)."""

    def __init__(self, gw: RunningGateway) -> None:
        self.open = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        l2 = gw.state.cache.l2
        assert isinstance(l2, RedisTier)
        self._read = l2.read
        l2.read = self.read  # type: ignore[method-assign]

    def read(self, key: str) -> asyncio.Future[bytes | None]:
        inner, outer = self._read(key), asyncio.get_running_loop().create_future()

        async def later() -> None:
            await self.open.wait()
            outer.set_result(await inner)

        task = asyncio.ensure_future(later())
        self.tasks.add(task)
        return outer


@pytest.mark.parametrize("tier", ["redis", "memcached"])
async def test_l2_hits_are_answered_on_the_wire_and_counted_once(
    make_gateway: GatewayFactory, request: pytest.FixtureRequest, tier: str
) -> None:
    if tier == "redis":
        gw = await l2_gateway(make_gateway, request.getfixturevalue("redis_url"))
    else:
        server: MemcachedServer = request.getfixturevalue("memcached")
        gw = await make_gateway(
            cache={"l2": "memcached", "memcached_servers": [server.server], "l1_max_bytes": 0}
        )
    (stored,) = await warm(gw, RAW)
    conn = await Conn.open(gw)
    fast = await conn.ask()  # the fast lane's L2 hit: learned
    before = await scrape(gw)
    wired = [await conn.ask() for _ in range(3)]
    after = await scrape(gw)
    assert lane(gw).served == 3
    for reply in wired:
        assert reply.body == stored and reply.headers["cache-status"].endswith("detail=l2")
        assert without_date(reply.headers) == without_date(fast.headers) and reply.names == fast.names
    for name, labels in [
        ("tokenedge_requests_total", {"result": "hit", "reason": "l2"}),
        ("tokenedge_cache_lookups_total", {"tier": "l2", "outcome": "hit"}),
        ("tokenedge_cache_lookups_total", {"tier": "l2"}),
    ]:
        assert value(after, name, **labels) - value(before, name, **labels) == 3, name
    conn.close()


async def test_an_l2_miss_on_the_wire_is_handed_to_the_normal_path_and_read_once(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    gw = await l2_gateway(make_gateway, redis_url, admin_token="admin-secret")
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    key = (await conn.ask()).headers["x-cache-key"]
    purge = await gw.client.post(
        "/admin/purge", json={"keys": [key]}, headers={"Authorization": "Bearer admin-secret"}
    )
    assert purge.status == 200
    before, calls = await scrape(gw), fake.calls["chat"]
    again = await conn.ask()
    after = await scrape(gw)
    assert again.headers["cache-status"].startswith("tokenedge; fwd=miss; stored")
    assert fake.calls["chat"] == calls + 1 and lane(gw).served == 0
    lookups = "tokenedge_cache_lookups_total"
    assert (
        value(after, lookups, tier="l2") - value(before, lookups, tier="l2") == 1
    )  # the wire lane's read only
    assert (
        value(after, lookups, tier="l2", outcome="miss") - value(before, lookups, tier="l2", outcome="miss")
        == 1
    )
    stages = "tokenedge_stage_duration_seconds_count"
    assert value(after, stages, stage="l2") - value(before, stages, stage="l2") == 1  # one timer, handed over
    conn.close()


async def test_reads_behind_an_l2_read_in_flight_wait_and_are_answered_in_order(
    make_gateway: GatewayFactory, redis_url: str
) -> None:
    gw = await l2_gateway(make_gateway, redis_url)
    (stored,) = await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()
    gate = Gate(gw)
    proto = their_connection(gw, conn)
    await conn.send(ONE)
    await until(lambda: proto.held is not None)  # the read is in flight: the connection holds
    await conn.send(ONE)
    await until(lambda: bool(proto.held))  # the second read arrived and waits behind it
    gate.open.set()
    replies = [await conn.reply(), await conn.reply()]
    assert [r.body for r in replies] == [stored, stored] and lane(gw).served == 2
    assert proto.held is None and proto.clean and proto.phase != HEAD
    conn.close()


async def test_a_client_gone_during_the_l2_read_is_counted_and_nothing_is_written(
    make_gateway: GatewayFactory, redis_url: str
) -> None:
    gw = await l2_gateway(make_gateway, redis_url)
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()
    gate = Gate(gw)
    proto = their_connection(gw, conn)
    before = await scrape(gw)
    await conn.send(ONE)
    await until(lambda: proto.held is not None)
    conn.close()
    await until(lambda: proto.transport is None)
    gate.open.set()
    await asyncio.gather(*gate.tasks)
    await until(lambda: proto.held is None)  # the read settled with nobody to answer
    after = await scrape(gw)
    gone = {"route": "chat/completions", "result": "client_gone"}
    assert (
        value(after, "tokenedge_requests_total", **gone) - value(before, "tokenedge_requests_total", **gone)
        == 1
    )
    assert lane(gw).served == 0


async def test_with_the_l2_breaker_open_the_wire_lane_steps_aside(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    gw = await l2_gateway(make_gateway, redis_url)
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()
    l2 = gw.state.cache.l2
    assert isinstance(l2, RedisTier)

    def refused(key: str) -> asyncio.Future[bytes | None]:
        raise L2Unavailable("l2 skipped for get: breaker open")

    l2.read = refused  # type: ignore[method-assign]
    before, calls = await scrape(gw), fake.calls["chat"]
    reply = await conn.ask()
    after = await scrape(gw)
    assert reply.status == 200 and "fwd=miss" in reply.headers["cache-status"]  # degraded, answered upstream
    assert fake.calls["chat"] == calls + 1 and lane(gw).served == 0
    errors = {"tier": "l2", "outcome": "error"}
    lookups = "tokenedge_cache_lookups_total"
    assert (
        value(after, lookups, **errors) - value(before, lookups, **errors) == 1
    )  # counted once, by the normal path
    conn.close()
