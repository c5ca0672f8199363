"""Clients that leave are not gateway errors: 1,000 aborted streams (hits and misses) log no traceback, count no
`result="error"`, and are counted as `result="client_gone"` where the handler saw the departure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, LOADED_UPSTREAM, GatewayFactory
from tests.gateway.test_stream import sse
from tests.support.fake_upstream import FakeUpstream

ABORTS = 500  # of each kind: hits and misses
PIECES = [f"p{i} " for i in range(6)]
FAKE_LOG = "fake.upstream"


@pytest.fixture
async def quiet_upstream(fake: FakeUpstream) -> AsyncIterator[str]:
    """The fake upstream, cancelling its handlers when the gateway hangs up, logging under its own name (its writes
    to a stream the gateway abandoned are the fake's business, not the gateway's)."""
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server(logger=logging.getLogger(FAKE_LOG))  # start_server sets handler_cancellation
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def abort_after_first_event(
    session: aiohttp.ClientSession, gw: RunningGateway, prompt: str, limit: asyncio.Semaphore
) -> str:
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    async with limit, session.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH_A) as resp:
        status = resp.headers.get("Cache-Status", "")
        async for event in sse(resp):
            if not event.startswith(":"):
                break
        resp.close()  # the client goes away mid-stream
    return status


def requests_by_result(gw: RunningGateway) -> dict[str, float]:
    gw.state.metrics.tally.flush()
    out: dict[str, float] = {}
    for metric in gw.state.metrics.requests.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                out[s.labels["result"]] = out.get(s.labels["result"], 0) + s.value
    return out


async def test_a_thousand_aborted_streams_are_not_errors(
    make_gateway: GatewayFactory, fake: FakeUpstream, quiet_upstream: str, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(
        quiet_upstream,
        stream={"replay_chunk_chars": 1, "replay_delay_s": 0.002},
        tokens={"enabled": False},
        upstream=LOADED_UPSTREAM,
    )
    fake.stream_pieces = PIECES
    async with aiohttp.ClientSession() as session:
        primed = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "hit"}]}
        async with session.post(gw.url + "/v1/chat/completions", json=primed, headers=AUTH_A) as resp:
            assert [e async for e in sse(resp)][-1] == "[DONE]"
        fake.stream_gates = [asyncio.Event() for _ in range(len(PIECES) + 2)]
        fake.stream_gates[0].set()  # misses stall after their first event until every client has left
        limit = asyncio.Semaphore(50)
        with caplog.at_level(logging.DEBUG):
            hits = await asyncio.gather(
                *(abort_after_first_event(session, gw, "hit", limit) for _ in range(ABORTS))
            )
            misses = await asyncio.gather(
                *(abort_after_first_event(session, gw, f"miss {i}", limit) for i in range(ABORTS))
            )
            for gate in fake.stream_gates:
                gate.set()
            for _ in range(100_000):
                if not gw.state.stream_flights:
                    break
                await asyncio.sleep(0)

    assert all("; hit" in s for s in hits) and all("fwd=miss" in s for s in misses)
    tracebacks = [
        r for r in caplog.records if (r.exc_info or r.levelno >= logging.ERROR) and r.name != FAKE_LOG
    ]
    assert tracebacks == []
    results = requests_by_result(gw)
    assert results.get("error", 0) == 0
    assert results.get("client_gone", 0) >= 1
    assert sum(results.values()) == 2 * ABORTS + 1
    assert (await gw.client.get("/health")).status == 200


async def test_a_reset_seen_by_a_write_is_logged_quietly(caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp.test_utils import make_mocked_request

    from gateway.app import error_middleware

    async def handler(_request: web.Request) -> web.StreamResponse:
        raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

    with caplog.at_level(logging.DEBUG):
        response = await error_middleware(make_mocked_request("POST", "/v1/chat/completions"), handler)
    assert not response.keep_alive
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert not any(r.exc_info for r in caplog.records)
