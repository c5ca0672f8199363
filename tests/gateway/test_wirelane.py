"""The wire lane (gateway/wirelane.py): repeated request bytes of an L1 hit answered from the read callback.

Raw keep-alive connections parsed by h11. The oracle is the fast lane's answer to the same bytes: the wire lane must
write the same response (but `Date`/`Age`), count the same hit, and answer nothing it cannot prove is the same
request: split or pipelined reads, a purged entry, a new model revision, another caller, `Connection: close`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace

import h11
from aiohttp import HttpVersion11

from gateway.edge import IDLE, EdgeRequestHandler, EdgeServer
from gateway.wireconn import awaited_length
from gateway.wirelane import MAX_LEARNED_BYTES, MAX_REQUEST_BYTES, WireLane
from tests.gateway.conftest import AUTH_A, GatewayFactory
from tests.gateway.test_fastpath import PATH, RAW, Reply, request_bytes, warm, without_date
from tests.gateway.test_metrics import scrape, value
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import FakeClock, RunningGateway

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


async def test_a_body_written_apart_from_its_head_is_waited_for_and_answered_on_the_wire(
    gw: RunningGateway,
) -> None:
    (stored,) = await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()  # learned
    proto = their_connection(gw, conn)
    for _ in range(2):
        await conn.send(ONE[: -len(RAW)])  # the head alone, then the body (httpx's sync transport writes so)
        await until(lambda: proto.partial is not None)
        await conn.send(RAW)
        reply = await conn.reply()
        assert reply.body == stored and reply.headers["cache-status"].endswith("detail=l1")
    assert lane(gw).served == 2 and proto.clean and proto.partial is None
    assert (
        proto.phase == IDLE
    )  # the body was not taken for a new head: no head deadline on an idle connection
    conn.close()


async def test_a_body_slower_than_the_hold_goes_to_the_parser_as_it_comes(gw: RunningGateway) -> None:
    (stored,) = await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()
    proto = their_connection(gw, conn)
    await conn.send(ONE[: -len(RAW)])
    await until(lambda: proto.partial is not None)
    await until(
        lambda: proto.partial is None
    )  # HOLD_BODY_S passed: the parser has the head, the body is awaited
    assert not proto.clean
    await conn.send(RAW)
    reply = await conn.reply()
    assert (
        reply.body == stored and reply.headers["cache-status"].endswith("detail=l1") and lane(gw).served == 0
    )
    conn.close()


async def test_a_head_split_across_reads_goes_to_the_parser_and_never_to_the_wire_again(
    gw: RunningGateway,
) -> None:
    await warm(gw, RAW)
    learner = await Conn.open(gw)
    await learner.ask()
    conn = await Conn.open(gw)
    await conn.send(ONE[:20])  # part of the request line: the parser takes it, the connection turns unclean
    await until(lambda: not their_connection(gw, conn).clean)
    await conn.send(ONE[20:])
    first = await conn.reply()
    again = await conn.ask()  # whole learned bytes, but this connection's parser was once mid-request
    assert first.headers["cache-status"].endswith("detail=l1")
    assert again.headers["cache-status"].endswith("detail=l1") and lane(gw).served == 0
    assert (await learner.ask()).body == again.body and lane(gw).served == 1  # a clean connection still is
    learner.close()
    conn.close()


async def test_a_head_with_expect_is_never_held_for_its_body(gw: RunningGateway) -> None:
    """`Expect: 100-continue` clients wait for the server before sending the body: the head goes to the parser."""
    await warm(gw, RAW)
    conn = await Conn.open(gw)
    await conn.ask()
    proto = their_connection(gw, conn)
    await conn.send(
        request_bytes("POST", PATH, b"", {"Expect": "100-continue"}).replace(
            b"Content-Length: 0", b"Content-Length: %d" % len(RAW)
        )
    )
    await until(lambda: not proto.clean)  # fed to the parser at once, not held
    assert proto.partial is None
    conn.close()


def test_awaited_length_waits_only_for_the_body_of_one_plain_small_post() -> None:
    whole = ONE
    head = whole[: -len(RAW)]
    assert awaited_length(head) == len(whole)
    assert awaited_length(head + RAW[:5]) == len(whole)
    assert awaited_length(whole) == 0  # complete
    assert awaited_length(whole + b"POST") == 0  # more than one request
    assert awaited_length(head[:-4]) == 0  # the head is not complete
    assert awaited_length(b"GET" + head[4:]) == 0
    assert (
        awaited_length(head.replace(b"Content-Length", b"Transfer-Encoding: chunked\r\nContent-Length")) == 0
    )
    assert awaited_length(head.replace(b"\r\n\r\n", b"\r\nContent-Length: 9\r\n\r\n")) == 0  # two
    for odd in (b"9x", b"", b"9" * 5000):
        assert awaited_length(head.replace(b"Content-Length: %d" % len(RAW), b"Content-Length: " + odd)) == 0
    big = head.replace(b"Content-Length: %d" % len(RAW), b"Content-Length: 20000")
    assert awaited_length(big) == 0  # over MAX_WHOLE_BYTES: the parser reads it


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
