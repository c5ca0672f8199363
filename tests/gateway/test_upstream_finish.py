"""A stream's connection goes back to the pool after its terminal event (`gateway.upstream.http.finish_body`).

The bytes that end a chunked body (`0\\r\\n\\r\\n`) often trail the last event by a read; a response released before
they arrive closes its connection, and the next miss pays a new one. Measured against our backend before the fix:
31-38 new connections for 80 serial streamed misses; after it, none past the first.

The raw upstream here holds the terminator until the test lets it go, so the order of events is fixed without
sleeps: the body's end is sent only once `finish_body` is already waiting for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from gateway.tokens.render import Rendering
from gateway.tokens.transport import RenderedStream
from gateway.upstream.http import FINISH_MAX_BYTES, finish_body
from gateway.upstream.routing.attempt import Routed
from gateway.upstream.transport import OpenResponse, UpstreamTransport
from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT
from tests.gateway.test_stream import collect, text_of
from tests.support.fake_upstream import FakeUpstream
from tests.support.transports import CountingUpstream

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class HeldEnd:
    """A keep-alive HTTP/1.1 upstream: each answer is one `[DONE]` event, then (`tail`, once `go_on` is set) more
    bytes, then the terminator once `release` is set. It counts the connections it accepted."""

    def __init__(self, tail: bytes = b"") -> None:
        self.tail = tail
        self.go_on = asyncio.Event()
        self.release = asyncio.Event()
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(HEAD + chunk(b"data: [DONE]\n\n"))
                if self.tail:
                    await self.go_on.wait()
                    writer.write(chunk(self.tail))
                await self.release.wait()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def read_done(resp: aiohttp.ClientResponse) -> None:
    data = b""
    while b"[DONE]" not in data:
        data += await resp.content.readany()


WRAPS: dict[str, Callable[[aiohttp.ClientResponse], object]] = {
    "aiohttp": lambda resp: resp,
    "routed": lambda resp: Routed(resp, b"", {}),  # the pool's (mutation: no Routed.finish)
    "rendered": lambda resp: RenderedStream(resp, Rendering("chat", 1, False)),  # the binary transport's
}


@pytest.mark.parametrize("wrap", WRAPS)
async def test_the_terminator_that_trails_the_last_event_is_read_and_the_connection_reused(wrap: str) -> None:
    upstream = HeldEnd()
    url = await upstream.start()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for _ in range(2):
            upstream.release.clear()
            resp = await session.post(url, data=b"{}")
            await read_done(resp)
            finishing = asyncio.create_task(finish_body(WRAPS[wrap](resp), timeout_s=30))
            await asyncio.sleep(
                0
            )  # a yield, not a wait: finish_body is now reading, the terminator not yet sent
            upstream.release.set()
            await finishing
            assert resp.content.at_eof()  # read here, before release: the connection is whole
            resp.release()
    await upstream.close()
    assert upstream.connections == 1  # mutation (finish_body returns at once): 2, and at_eof fails first


@pytest.mark.timeout(
    20
)  # mutation (no byte bound): it waits out its 60 s for an end that never comes, and fails
async def test_a_body_that_goes_on_past_its_end_is_not_read_without_bound() -> None:
    upstream = HeldEnd(tail=b"x" * (2 * FINISH_MAX_BYTES))
    url = await upstream.start()
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url, data=b"{}")
        await read_done(resp)
        upstream.go_on.set()
        await finish_body(resp, timeout_s=60)  # returns after FINISH_MAX_BYTES, the terminator still held
        assert not resp.content.at_eof()
        resp.release()  # closes it: this connection is not whole
        upstream.release.set()
    await upstream.close()


async def test_an_end_that_never_comes_costs_at_most_the_bound() -> None:
    upstream = HeldEnd()
    url = await upstream.start()
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url, data=b"{}")
        await read_done(resp)
        await finish_body(resp, timeout_s=0.01)  # the terminator is held: the bound ends the wait
        assert not resp.content.at_eof()
        resp.release()
        upstream.release.set()
    await upstream.close()


class FinishSpy(CountingUpstream):
    """`CountingUpstream` that also counts the responses the tee finished (`finish`, then the real one)."""

    def __init__(self, inner: UpstreamTransport) -> None:
        super().__init__(inner)
        self.finished = 0

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[OpenResponse]:
        async with super().open_stream(method, path_qs, headers, body) as resp:
            spy = self

            class Spied:
                status, headers, content = resp.status, resp.headers, resp.content

                async def read(self) -> bytes:
                    return await resp.read()

                async def finish(self, timeout_s: float) -> None:
                    spy.finished += 1
                    await finish_body(resp, timeout_s)

            yield Spied()


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
async def test_the_tee_finishes_a_whole_stream_and_not_a_cut_one(
    gw: RunningGateway, fake: FakeUpstream, endpoint: str
) -> None:
    gw.state.upstream = spy = FinishSpy(gw.state.upstream)
    body: dict[str, Any] = {**CHAT, "stream": True}
    if endpoint == "completions":
        body = {"model": CHAT["model"], "prompt": "2+2=", "temperature": 0, "stream": True}
    resp = await gw.client.post(f"/v1/{endpoint}", json=body, headers=AUTH_A)
    assert text_of(await collect(resp)) == "Hello, world!"
    assert spy.finished == 1  # mutation (the tee's finish_body call removed): 0

    fake.stream_fail_after = 2  # the upstream drops the connection mid-stream: nothing to finish
    cut = await gw.client.post(f"/v1/{endpoint}", json={**body, "max_tokens": 3}, headers=AUTH_A)
    await collect(cut)
    assert spy.finished == 1
