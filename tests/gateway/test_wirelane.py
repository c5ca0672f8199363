"""The wire lane (gateway/wirelane.py): repeated request bytes of an L1 hit answered from the read callback.

Raw keep-alive connections parsed by h11. The oracle is the fast lane's answer to the same bytes: the wire lane must
write the same response (but `Date`/`Age`), count the same hit, and answer nothing it cannot prove is the same
request: split or pipelined reads, a purged entry, a new model revision, another caller, `Connection: close`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import h11
from aiohttp import HttpVersion11

from gateway.edge import EdgeRequestHandler, EdgeServer
from gateway.wirelane import MAX_LEARNED_BYTES, MAX_REQUEST_BYTES, WireLane
from tests.gateway.conftest import AUTH_A, GatewayFactory
from tests.gateway.test_fastpath import PATH, RAW, Reply, request_bytes, run, warm, without_date
from tests.gateway.test_metrics import parse as parse_metrics
from tests.gateway.test_metrics import scrape, value
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import FakeClock, RunningGateway
from tests.support.workers import gateway_workers

ONE = request_bytes("POST", PATH, RAW)  # one whole request, sent in one write


def edge_of(gw: RunningGateway) -> EdgeServer:
    server = gw.server.runner.server if gw.server.runner is not None else None
    assert isinstance(server, EdgeServer)
    return server


def lane(gw: RunningGateway) -> WireLane:
    wire = edge_of(gw).wire
    assert wire is not None
    return wire


def their_connection(gw: RunningGateway, conn: Conn) -> EdgeRequestHandler:
    mine = conn.writer.get_extra_info("sockname")
    (proto,) = [
        p
        for p in edge_of(gw).live
        if isinstance(p, EdgeRequestHandler)
        and p.transport is not None
        and p.transport.get_extra_info("peername") == mine
    ]
    return proto


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) for server-side state the test cannot await directly: yields to the loop it shares."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0)


class Conn:
    """One keep-alive client connection; replies parsed by h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, gw: RunningGateway | tuple[str, int]) -> Conn:
        host, port = gw if isinstance(gw, tuple) else (gw.server.host, gw.server.port)
        return cls(*await asyncio.open_connection(host, port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self) -> Reply:
        conn = self.h11
        if conn.our_state is h11.DONE:
            conn.start_next_cycle()
        conn.send(
            h11.Request(method="POST", target=PATH, headers=[("Host", "gateway"), ("Content-Length", "0")])
        )
        conn.send(h11.EndOfMessage())
        reply: Reply | None = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(self.reader.read(65536), 10))
            elif isinstance(event, h11.Response):
                reply = Reply(event.status_code, {k.decode(): v.decode() for k, v in event.headers})
                reply.names = [k.decode() for k, _ in event.headers.raw_items()]
            elif isinstance(event, h11.Data):
                assert reply is not None
                reply.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert reply is not None
                return reply

    async def ask(self, data: bytes = ONE) -> Reply:
        await self.send(data)
        return await self.reply()

    def close(self) -> None:
        self.writer.close()


async def test_repeated_bytes_are_answered_on_the_wire_exactly_as_the_fast_lane_answers(
    gw: RunningGateway,
) -> None:
    (stored,) = await warm(gw, RAW)
    conn = await Conn.open(gw)
    fast = await conn.ask()  # the fast lane serves it and learns these bytes
    assert lane(gw).served == 0 and len(lane(gw)) >= 1
    before = await scrape(gw)
    wired = [await conn.ask() for _ in range(3)]
    after = await scrape(gw)
    assert lane(gw).served == 3
    answers = "tokenedge_wire_lane_answers_total"
    assert value(after, answers, tier="l1") - value(before, answers, tier="l1") == 3
    for reply in wired:
        assert reply.status == 200 and reply.body == fast.body == stored
        assert reply.headers["cache-status"] == "tokenedge; hit; ttl=3600; detail=l1"
        assert without_date(reply.headers) == without_date(fast.headers)
        assert reply.names == fast.names  # same headers, same order, none twice
    hits = {"route": "chat/completions", "result": "hit", "reason": "l1"}
    assert (
        value(after, "tokenedge_requests_total", **hits) - value(before, "tokenedge_requests_total", **hits)
        == 3
    )
    lookups = {"tier": "l1", "outcome": "hit"}
    assert (
        value(after, "tokenedge_cache_lookups_total", **lookups)
        - value(before, "tokenedge_cache_lookups_total", **lookups)
        == 3
    )
    conn.close()


async def test_keep_alive_is_restarted_by_each_answer_on_the_wire(gw: RunningGateway) -> None:
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()
    proto = their_connection(gw, conn)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await conn.ask()
    assert lane(gw).served == 1
    assert proto._next_keepalive_close_time >= start + proto._keepalive_timeout
    assert proto._keepalive and proto._keepalive_handle is not None and proto.clean
    conn.close()


async def test_a_request_split_across_reads_is_never_answered_on_the_wire(gw: RunningGateway) -> None:
    await warm(gw, RAW)
    learner = await Conn.open(gw)
    await learner.ask()
    conn = await Conn.open(gw)
    head, body = ONE[: -len(RAW)], RAW
    await conn.send(head)
    await until(lambda: any(not p.clean for p in edge_of(gw).live if isinstance(p, EdgeRequestHandler)))
    await conn.send(body)
    first = await conn.reply()
    again = await conn.ask()  # whole learned bytes, but this connection's parser was once mid-request
    assert first.headers["cache-status"].endswith("detail=l1") and again.headers["cache-status"].endswith(
        "l1"
    )
    assert lane(gw).served == 0
    assert (await learner.ask()).body == again.body and lane(gw).served == 1  # a clean connection still is
    learner.close()
    conn.close()


async def test_pipelined_copies_in_one_read_are_answered_in_order_by_the_parser(gw: RunningGateway) -> None:
    (stored,) = await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()
    await conn.send(ONE + ONE)
    replies = [await conn.reply(), await conn.reply()]
    assert [r.body for r in replies] == [stored, stored]
    assert (await conn.ask()).body == stored
    assert lane(gw).served == 0
    conn.close()


async def test_a_purged_entry_is_never_answered_on_the_wire(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(server={"admin_token": "admin-secret"})
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    key = (await conn.ask()).headers["x-cache-key"]
    purge = await gw.client.post(
        "/admin/purge", json={"keys": [key]}, headers={"Authorization": "Bearer admin-secret"}
    )
    assert purge.status == 200, await purge.text()
    calls = fake.calls["chat"]
    again = await conn.ask()
    assert again.headers["cache-status"].startswith("tokenedge; fwd=miss; stored")
    assert fake.calls["chat"] == calls + 1 and lane(gw).served == 0
    assert (await conn.ask()).headers["cache-status"].endswith("detail=l1") and lane(gw).served == 1
    conn.close()


async def test_a_new_model_revision_is_never_answered_from_the_old_one_on_the_wire(
    gw: RunningGateway, fake: FakeUpstream, clock: FakeClock
) -> None:
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    old = await conn.ask()
    fake.revision = "rev-2"
    clock.advance(31)  # the catalog is due: the lanes step aside, the normal path refreshes it
    await conn.ask()
    refresh = gw.state.catalog._refresh
    assert refresh is not None
    await refresh
    served = lane(gw).served
    new = await conn.ask()
    assert new.headers["x-cache-key"] != old.headers["x-cache-key"]
    assert new.headers["cache-status"].startswith("tokenedge; fwd=miss") and lane(gw).served == served
    conn.close()


async def test_other_callers_and_closing_requests_get_their_own_answers(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    mine = await conn.ask()
    other = request_bytes("POST", PATH, RAW).replace(AUTH_A["Authorization"].encode(), b"Bearer tenant-b")
    theirs = await conn.ask(other)
    assert theirs.headers["cache-status"].startswith("tokenedge; fwd=miss")
    assert theirs.headers["x-cache-key"] != mine.headers["x-cache-key"]
    learned = len(lane(gw))
    closing = await conn.ask(request_bytes("POST", PATH, RAW, {"Connection": "close"}))
    assert closing.headers["connection"] == "close" and closing.headers["cache-status"].endswith("l1")
    assert await asyncio.wait_for(conn.reader.read(1), 10) == b""  # closed, as announced
    assert len(lane(gw)) == learned and lane(gw).served == 0  # never learned: it closes the connection
    assert fake.calls["chat"] == 2
    conn.close()


async def test_the_wire_lane_can_be_turned_off(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"wire_lane": False})
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    replies = [await conn.ask() for _ in range(3)]
    assert all(r.headers["cache-status"].endswith("detail=l1") for r in replies)
    assert edge_of(gw).wire is None
    conn.close()


def _learn(wire: WireLane, chunk: bytes, body: bytes, *, keep_alive: bool = True) -> None:
    message = object()
    request = SimpleNamespace(
        protocol=SimpleNamespace(whole=(message, chunk)),
        _message=message,
        keep_alive=keep_alive,
        version=HttpVersion11,
    )
    parsed = SimpleNamespace(key_context=("tscope", "rev-1", ""))
    wire.learn(request, "chat/completions", body, (parsed, "key"))  # type: ignore[arg-type]


def test_learned_bytes_are_bounded_and_only_whole_keep_alive_requests_are_learned() -> None:
    state = SimpleNamespace(tenancy=SimpleNamespace(tenant_header=""))
    wire = WireLane(state)  # type: ignore[arg-type]
    body = b"x" * 1000
    _learn(wire, b"HEAD" + body, body, keep_alive=False)
    _learn(wire, b"H" * MAX_REQUEST_BYTES + body, body)  # too large to learn
    _learn(wire, b"HEAD" + b"y" * 1000, body)  # the chunk does not end with the body: not this request
    assert len(wire) == 0
    per = 1004
    fits = MAX_LEARNED_BYTES // per
    for i in range(fits):
        _learn(wire, b"%04d" % i + body, body)
    assert len(wire) == fits
    _learn(wire, b"next" + body, body)  # full: the table starts over with this one
    assert len(wire) == 1
    trusted = WireLane(SimpleNamespace(tenancy=SimpleNamespace(tenant_header="X-Tenant")))  # type: ignore[arg-type]
    _learn(trusted, b"HEAD" + body, body)  # the scope depends on the peer: never learned
    assert len(trusted) == 0


async def test_a_gateway_process_on_uvloop_answers_wrk_and_raw_clients_through_the_wire_lane(
    upstream_url: str, tmp_path: Path
) -> None:
    """`python -m gateway` (uvloop on, as deployed): wrk on keep-alive connections sees only well-formed hits, each
    counted once; raw connections get byte-identical bodies and headers (but `Date`/`Age`) on every repeat."""
    async with gateway_workers(upstream_url, 1) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = await Conn.open((host, int(port)))
        first, *repeats = [await conn.ask() for _ in range(4)]  # miss, fast lane (learns), then the wire lane
        assert first.headers["cache-status"].startswith("tokenedge; fwd=miss; stored")
        for reply in repeats:
            assert reply.body == first.body and reply.headers["cache-status"].endswith("detail=l1")
            assert without_date(reply.headers) == without_date(repeats[0].headers)
        script = tmp_path / "post.lua"
        script.write_text(
            f'wrk.method = "POST"\nwrk.body = [[{RAW.decode()}]]\n'
            f'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "{AUTH_A["Authorization"]}"\n'
        )
        before = parse_metrics(await get_text(url + "/metrics"))
        code, out = await run("wrk", "-t1", "-c8", "-d1s", "-s", str(script), url + PATH)
        after = parse_metrics(await get_text(url + "/metrics"))
        conn.close()
    assert code == 0 and "Socket errors" not in out and "Non-2xx" not in out, out
    done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    counted = {
        name: value(after, name, **labels) - value(before, name, **labels)
        for name, labels in [
            ("tokenedge_requests_total", {"result": "hit", "reason": "l1"}),
            ("tokenedge_wire_lane_answers_total", {"tier": "l1"}),
        ]
    }
    # Every request counted once (at most one per connection still in flight at the end); all but each
    # connection's first (the fast lane serves and learns it) answered on the wire.
    assert done > 100 and done <= counted["tokenedge_requests_total"] <= done + 8
    assert counted["tokenedge_wire_lane_answers_total"] >= done - 8


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.text()
