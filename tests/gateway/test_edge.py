"""The HTTP edge (gateway/edge/server.py): read deadlines, the connection cap, and aiohttp's protocol errors as JSON.

No wall-clock asserts: a slow client is known to be closed by its 408 and its EOF, normal requests are known to be
unaffected by finishing while every slow connection is still open, and the metric counts each close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
import orjson
import pytest

from gateway.edge.server import HANDLING, IDLE, EdgeServer
from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.rawhttp import RawResponse, exchange, parse_responses, request_bytes

SLOW_BODY = 500


def edge_of(gw: RunningGateway) -> EdgeServer:
    runner = gw.server.runner
    assert runner is not None and isinstance(runner.server, EdgeServer)
    return runner.server


def slow_clients(gw: RunningGateway, phase: str) -> float:
    return gw.state.metrics.slow_clients.labels(phase)._value.get()


async def until(predicate: Callable[[], bool], guard_s: float = 60.0) -> None:
    """Yield to the loop until `predicate` holds; `guard_s` only bounds a hang (a loaded machine needs more loop
    turns for the same progress, so a count of turns is no bound)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + guard_s
    while loop.time() < give_up:
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def hold_open(port: int, data: bytes, opened: list[asyncio.StreamWriter]) -> list[RawResponse]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened.append(writer)
    writer.write(data)
    try:
        async with asyncio.timeout(60):  # a guard against a hang, not a measurement
            raw = await reader.read(-1)
    finally:
        writer.close()
    return parse_responses(raw)


async def test_slow_bodies_are_closed_while_normal_requests_are_served(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"body_read_timeout_s": 3.0, "body_total_s": 6.0})
    port = gw.server.port
    assert port is not None
    edge = edge_of(gw)
    partial = request_bytes(
        "POST",
        "/v1/chat/completions",
        {"Content-Type": "application/json", "Content-Length": "400"},
        b'{"model": "test-',
    )
    opened: list[asyncio.StreamWriter] = []
    slow = [asyncio.create_task(hold_open(port, partial, opened)) for _ in range(SLOW_BODY)]
    await until(lambda: sum(c.phase == HANDLING for c in edge.live) == SLOW_BODY)

    async with aiohttp.ClientSession() as session:
        for i in range(20):
            body = {**CHAT, "messages": [{"role": "user", "content": f"normal {i}"}]}
            async with session.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH_A) as resp:
                assert resp.status == 200
        normal_done_with_slow_open = sum(not t.done() for t in slow)

    answers = await asyncio.gather(*slow)
    assert (
        normal_done_with_slow_open == SLOW_BODY
    )  # every normal request finished before any slow one was closed
    assert [len(a) for a in answers] == [1] * SLOW_BODY
    assert {a[0].status for a in answers} == {408}
    assert all(a[0].is_openai_error() for a in answers)
    assert slow_clients(gw, "body") == SLOW_BODY
    assert not edge.live or all(c.phase != HANDLING for c in edge.live)


async def test_slow_heads_are_closed_with_a_json_408(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"header_read_timeout_s": 0.2, "header_total_s": 0.5})
    port = gw.server.port
    assert port is not None
    opened: list[asyncio.StreamWriter] = []
    silent = [asyncio.create_task(hold_open(port, b"", opened)) for _ in range(10)]
    partial = [
        asyncio.create_task(hold_open(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", opened))
        for _ in range(10)
    ]
    answers = await asyncio.gather(*silent, *partial)
    assert all(len(a) == 1 and a[0].status == 408 and a[0].is_openai_error() for a in answers)
    assert slow_clients(gw, "header") == 20
    assert (await gw.client.get("/health")).status == 200


async def test_a_trickling_head_meets_the_total_deadline(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"header_read_timeout_s": 5.0, "header_total_s": 0.3})
    port = gw.server.port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\n")
    closed = asyncio.create_task(reader.read(-1))
    while not closed.done():  # one header byte whenever the loop comes round: never a per-read timeout
        writer.write(b"X")
        await asyncio.wait({closed}, timeout=0.05)
    writer.close()
    assert parse_responses(closed.result())[0].status == 408
    assert slow_clients(gw, "header") == 1


async def test_connections_over_the_cap_are_closed(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(
        server={"max_connections": 3, "header_read_timeout_s": 30.0, "header_total_s": 60.0}
    )
    port = gw.server.port
    assert port is not None
    edge = edge_of(gw)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    await until(lambda: len(edge.live) == 3)

    [over] = [await exchange(port, request_bytes("GET", "/health"))]

    assert over == []  # closed without an answer
    assert slow_clients(gw, "capacity") == 1
    for _, writer in held:
        writer.close()
    await until(lambda: not edge.live)
    assert [r.status for r in await exchange(port, request_bytes("GET", "/health"))] == [200]


PROTOCOL_ERRORS = {
    "bad content-length": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "two content-lengths": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}",
    "te and cl": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\n0\r\n\r\n",
    "bad transfer-encoding": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: zip\r\n\r\n",
    "bad chunk size": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nab\r\n0\r\n\r\n",
    "bad method": b"G@T /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad version": b"GET /health HTTP/9.x\r\nHost: x\r\n\r\n",
    "oversized header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    "oversized line": b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "no colon": b"GET /health HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n",
    "asterisk": b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
    "binary": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)) + b"\r\n\r\n",
}


@pytest.mark.parametrize("name", list(PROTOCOL_ERRORS))
async def test_protocol_errors_are_json_400s_without_tracebacks(
    make_gateway: GatewayFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway()
    port = gw.server.port
    assert port is not None
    with caplog.at_level(logging.DEBUG):
        responses = await exchange(port, PROTOCOL_ERRORS[name])
    assert responses, "no answer"
    assert responses[-1].status == 400
    assert responses[-1].is_openai_error()
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING] == []


async def test_a_body_over_the_limit_is_413_json(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"max_body_bytes": 2048})
    port = gw.server.port
    assert port is not None
    chunked = (
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"".join(b"400\r\n" + b"a" * 1024 + b"\r\n" for _ in range(3))
        + b"0\r\n\r\n"
    )
    [declared] = await exchange(
        port, request_bytes("POST", "/v1/files", {"Content-Length": "4096"}, b"a" * 4096)
    )
    [streamed] = await exchange(port, chunked)
    assert declared.status == streamed.status == 413
    assert orjson.loads(streamed.body)["error"]["code"] == "payload_too_large"


async def test_an_idle_keepalive_connection_after_a_streamed_body_gets_no_spurious_408(
    make_gateway: GatewayFactory,
) -> None:
    gw = await make_gateway(server={"header_read_timeout_s": 0.1, "header_total_s": 0.2})
    port = gw.server.port
    assert port is not None
    edge = edge_of(gw)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = orjson.dumps(CHAT)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer a\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    await until(lambda: any(c.phase == HANDLING for c in edge.live))
    writer.write(body)  # the body arrives while the request is being handled
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    await reader.readexactly(length)
    await until(lambda: all(c.phase != HANDLING for c in edge.live))
    idle = [c.phase for c in edge.live]
    edge.sweep(now=asyncio.get_running_loop().time() + 3600)  # long past every deadline: an idle keep-alive
    # connection is not a slow head, so nothing is closed or fabricated for it
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    rest = parse_responses(await reader.read(-1))
    writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert idle == [IDLE]
    assert [r.status for r in rest] == [200]
    assert slow_clients(gw, "header") == 0
