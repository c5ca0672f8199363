"""Aborted streams: 200 clients leave mid-stream at seeded random points; nothing partial is stored, nothing leaks.

A handful of keys with many clients each; the fake upstream's per-chunk gates pace the streams, and the test
releases chunk i only after every client still reading has its first i events and the gateway has seen every
departure. No sleeps: the waits are on conditions (an asyncio.Condition, or polling the loop with sleep(0)).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import pytest

from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.gateway.test_stream import sse, text_of
from tests.support.fake_upstream import FakeUpstream
from tests.support.transports import CountingUpstream

KEYS = 5
CLIENTS = 200
PIECES = [f"part{i} " for i in range(8)]
EVENTS = len(PIECES) + 2  # role delta, the pieces, the finish chunk (then [DONE])


@dataclass
class Client:
    key: int
    abort_at: int  # data events read before closing the connection
    received: int = 0
    done: bool = False
    cache_key: str = ""


async def until(predicate: Callable[[], bool], rounds: int = 20_000) -> None:
    """Let the loop run (sockets included) until `predicate()` holds."""
    for _ in range(rounds):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def run_client(
    session: aiohttp.ClientSession, url: str, client: Client, progress: asyncio.Condition
) -> None:
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": f"question {client.key}"}]}
    try:
        async with session.post(url, json=body, headers=AUTH_A) as resp:
            client.cache_key = resp.headers["X-Cache-Key"]
            async for event in sse(resp):
                if event.startswith(":"):
                    continue
                client.received += 1
                async with progress:
                    progress.notify_all()
                if client.received >= client.abort_at:
                    resp.close()  # the client goes away mid-stream
                    return
    finally:
        client.done = True
        async with progress:
            progress.notify_all()


async def abort_everyone(gw: RunningGateway, fake: FakeUpstream) -> list[Client]:
    rng = random.Random(20240603)
    clients = [Client(key=i % KEYS, abort_at=rng.randint(1, EVENTS - 1)) for i in range(CLIENTS)]
    fake.stream_pieces = PIECES
    fake.stream_gates = [asyncio.Event() for _ in range(EVENTS)]
    fake.stream_gates[0].set()
    progress = asyncio.Condition()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [
            asyncio.create_task(run_client(session, gw.url + "/v1/chat/completions", c, progress))
            for c in clients
        ]
        for i in range(1, EVENTS):
            async with progress:
                await progress.wait_for(lambda i=i: all(c.done or c.received >= i for c in clients))
            reading = sum(not c.done for c in clients)
            await until(lambda n=reading: sum(f.alive() for f in gw.state.stream_flights.values()) <= n)
            fake.stream_gates[i].set()
        await asyncio.gather(*tasks)
    await until(lambda: len(gw.state.stream_flights) == 0)
    return clients


@pytest.mark.parametrize("complete_abandoned", [False, True])
async def test_two_hundred_aborted_clients_store_nothing_partial_and_leak_nothing(
    make_gateway: GatewayFactory, fake: FakeUpstream, complete_abandoned: bool
) -> None:
    gw = await make_gateway(stream={"complete_abandoned_streams": complete_abandoned})
    gw.state.upstream = upstream = CountingUpstream(gw.state.upstream)
    tasks_before = len(asyncio.all_tasks())

    clients = await abort_everyone(gw, fake)

    assert all(c.done and c.received == c.abort_at for c in clients)
    assert fake.calls["chat"] == KEYS  # every key's clients shared one upstream stream
    keys = {c.cache_key for c in clients}
    assert len(keys) == KEYS
    for key in keys:
        found = await gw.state.cache.get(key)
        if complete_abandoned:
            assert found is not None and found.entry.stream_chunks is not None
            events = [chunk.decode() for chunk in found.entry.stream_chunks]
            assert text_of(events) == "".join(PIECES)
        else:
            assert found is None
    assert upstream.opened == KEYS
    await until(lambda: upstream.open_now == 0)  # every upstream stream was closed: no connection held
    # A completed stream leaves its connection idle in the keep-alive pool (one fake-upstream task each).
    idle = KEYS if complete_abandoned else 0
    await until(lambda: len(asyncio.all_tasks()) <= tasks_before + idle)
