"""The fleet's faults on real engines: two native `llama-server` processes (one slot, one thread each) behind one
gateway. One is SIGSTOPped, as a wedged engine would be: it still completes TCP handshakes, so only the gateway's
own bounded health checks and deadlines can find it. No non-streamed request may fail, a stream already flowing
from it ends with a clean error, it is ejected within the first-byte deadline, the other engine keeps serving, and
after SIGCONT the restored engine takes at least a third of the next requests. And an engine kept busy by a client
the gateway never saw (another replica, a direct caller) is seen through its own `/slots` and avoided.

Every wait on a real process is a bounded poll; every request is unique, so the response cache never answers.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from backend.loader import default_model_path
from gateway.upstream.routing.attempt import BACKEND_HEADER
from gateway.upstream.routing.breaker import BreakerState
from gateway.upstream.routing.pool import UpstreamPool
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from harness.peers.llama_server import LlamaServer, llama_server
from harness.peers.llamacpp_build import ensure_build

ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
FIRST_BYTE_S = 6.0
SYSTEM = "You are a terse assistant for a museum of rainbows. " * 6
pytestmark = pytest.mark.timeout(600)
serial = itertools.count()


def pid_of(server: LlamaServer) -> int:
    """The process running `server` (its exact argv), read from /proc."""
    want = "\0".join(server.argv) + "\0"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_text() == want:
                    return int(entry.name)
            except OSError:
                continue
    raise LookupError(f"no process runs {server.argv[0]}")


@pytest.fixture(scope="module")
def engines() -> Iterator[list[LlamaServer]]:
    build = ensure_build()  # BuildUnavailable names the reason: an error, never a skip
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                llama_server(build, default_model_path(), alias=ALIAS, slots=1, threads=1, metrics=True)
            )
            for _ in range(2)
        ]


@pytest.fixture
async def gw(engines: list[LlamaServer]) -> AsyncIterator[RunningGateway]:
    urls = ",".join(e.url for e in engines)
    upstream = {
        "url": urls,
        "model_revision": "llama.cpp-test",
        "read_timeout_s": 60.0,
        "health_interval_s": 0.25,
        "health_timeout_s": 1.0,
        "eject_after_failures": 2,
        "eject_base_s": 0.5,
        "first_byte_timeout_s": FIRST_BYTE_S,
    }
    gateway = await start_gateway(gateway_config(urls, upstream=upstream), FakeClock())
    try:
        yield gateway
    finally:
        await gateway.close()


def body(*, stream: bool = False, max_tokens: int = 4) -> dict[str, Any]:
    question = f"Question {next(serial)}: name a colour."  # unique: never a cache hit
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {
        "model": ALIAS,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def ask(session: aiohttp.ClientSession, gw: RunningGateway) -> tuple[int, str]:
    async with session.post(gw.url + "/v1/chat/completions", json=body()) as resp:
        await resp.read()
        return resp.status, resp.headers.get(BACKEND_HEADER, "")


async def until(condition: Any, limit_s: float) -> float:
    """Poll `condition` (bounded); the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < limit_s, "condition not reached in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def name(engine: LlamaServer) -> str:
    return engine.url.removeprefix("http://")


async def test_a_stopped_engine_is_ejected_its_work_moves_and_load_comes_back(
    gw: RunningGateway, engines: list[LlamaServer]
) -> None:
    pool = gw.state.upstream
    assert isinstance(pool, UpstreamPool)
    victim, healthy = engines
    pid = pid_of(victim)
    async with aiohttp.ClientSession() as session:
        assert [s for s, _ in await asyncio.gather(*(ask(session, gw) for _ in range(2)))] == [200, 200]
        os.kill(pid, signal.SIGSTOP)
        try:
            ejection = asyncio.ensure_future(
                until(lambda: pool.backends[0].breaker.ejections >= 1, FIRST_BYTE_S)
            )
            during = await asyncio.wait_for(asyncio.gather(*(ask(session, gw) for _ in range(6))), 60)
            ejected_after = await ejection  # seconds from SIGSTOP: within the first-byte deadline
        finally:
            os.kill(pid, signal.SIGCONT)
        assert [s for s, _ in during] == [200] * 6  # no non-streamed request failed
        assert {b for _, b in during} == {name(healthy)}  # the healthy engine served them all
        assert pool.backends[0].breaker.ejections >= 1
        await until(lambda: pool.backends[0].breaker.state is BreakerState.CLOSED, 30)
        # recovered: readmitted, and done with what it was sent while stopped (its own /metrics says so)
        await until(lambda: pool.backends[0].foreign_busy == 0, 30)
        after: list[str] = []
        for _ in range(3):  # concurrency 2, as a client pair would
            after += [b for _, b in await asyncio.gather(ask(session, gw), ask(session, gw))]
    print(f"ejected within {ejected_after:.2f} s of SIGSTOP; after recovery: {after}")
    assert after.count(name(victim)) >= len(after) / 3


async def test_a_stream_flowing_from_an_engine_that_stops_ends_with_a_clean_error(
    gw: RunningGateway, engines: list[LlamaServer]
) -> None:
    pids = {name(e): pid_of(e) for e in engines}
    long_stream = {**body(stream=True, max_tokens=400), "ignore_eos": True}  # still flowing when stopped
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/chat/completions", json=long_stream) as resp,
    ):
        assert resp.status == 200
        serving = resp.headers[BACKEND_HEADER]
        first = await resp.content.readline()
        assert first.startswith(b"data: ")
        os.kill(pids[serving], signal.SIGSTOP)
        try:
            rest = await asyncio.wait_for(resp.content.read(), 30)
        finally:
            os.kill(pids[serving], signal.SIGCONT)
    assert b'"error"' in rest and b"[DONE]" not in rest  # an error event, never a silently cut stream


async def test_an_engine_busy_with_a_direct_client_is_seen_and_avoided(
    gw: RunningGateway, engines: list[LlamaServer]
) -> None:
    pool = gw.state.upstream
    assert isinstance(pool, UpstreamPool)
    await until(lambda: all(b.reported_slots == 1 for b in pool.backends), 10)  # read from each /slots
    busy, free = engines
    async with aiohttp.ClientSession() as session:
        direct = asyncio.ensure_future(  # another client, straight to the engine: the gateway never saw it
            session.post(busy.url + "/v1/chat/completions", json={**body(max_tokens=300), "ignore_eos": True})
        )
        try:
            await until(lambda: pool.backends[0].foreign_busy == 1, 15)
            routed = [b for _, b in [await ask(session, gw) for _ in range(2)]]
        finally:
            (await direct).close()
    assert routed == [name(free)] * 2
