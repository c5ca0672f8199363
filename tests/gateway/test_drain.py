"""SIGTERM on a real `python -m gateway` (gateway/edge/drain.py): a rolling update loses no work.

Fifty slow streams are in flight, each held by the fake upstream after its first chunk. On SIGTERM `/ready` turns
503 at once while the listener still accepts; after the grace new connections are refused while the streams still
run; released, every stream completes whole and the process exits 0 well within the drain bound. Past the
deadline a stream is cut, and what was cut is not stored: a second gateway on the same Redis misses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from harness.services import free_port
from harness.workers import REPO, listening_sockets
from tests.support.fake_upstream import FakeUpstream

STREAMS = 50  # the number (issue 38: "SIGTERM with 50 streams in flight")
GRACE_S = 1.0
TIMEOUT_S = 20.0


def body(i: int) -> dict[str, Any]:
    """A distinct cacheable streamed request per `i` (distinct keys: no coalescing)."""
    return {
        "model": "test-model",
        "temperature": 0,
        "messages": [{"role": "user", "content": f"q{i}"}],
        "stream": True,
    }


@contextlib.asynccontextmanager
async def gateway_process(
    upstream_url: str, tmp: Path, *, env: Mapping[str, str] = {}, server: Mapping[str, str] = {}
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`python -m gateway` with `server.*` overrides, once every worker listens: (process, base URL)."""
    port = free_port()
    log = tmp / f"gateway-{port}.log"
    full_env = {
        **os.environ,
        **env,
        "TOKENEDGE_UPSTREAM_URL": upstream_url,
        "TOKENEDGE_SERVER_PORT": str(port),
        "TOKENEDGE_SERVER_STATE_DIR": str(tmp / "state"),
        **{f"TOKENEDGE_SERVER_{name.upper()}": value for name, value in server.items()},
    }
    workers = int(server.get("workers", "1"))
    if workers > 1:  # the workers' shared counters, in the test's own folder
        (tmp / f"metrics-{port}").mkdir()
        full_env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / f"metrics-{port}")
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", cwd=REPO, env=full_env, stdout=out, stderr=out
        )
    try:
        for _ in range(600):  # bounded (~60 s): the port is bound by every worker
            if listening_sockets(port) >= workers or proc.returncode is not None:
                break
            await asyncio.sleep(0.1)
        assert listening_sockets(port) >= workers, log.read_text()[-3000:]
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def stream(session: aiohttp.ClientSession, url: str, i: int, started: asyncio.Event) -> bytes:
    """One streamed completion: `started` once its first event arrived, then the rest until the end."""
    async with session.post(f"{url}/v1/chat/completions", json=body(i)) as resp:
        assert resp.status == 200
        first = await resp.content.readuntil(b"\n\n")
        started.set()
        try:
            rest = await resp.content.read()
        except aiohttp.ClientPayloadError:  # cut mid-stream: what came before the cut
            rest = b""
        return first + rest


def text_and_done(raw: bytes) -> tuple[str, bool]:
    """The streamed text and whether the stream ended with `[DONE]`."""
    events = [line.removeprefix(b"data: ") for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    text = "".join(
        (choice.get("delta") or {}).get("content") or ""
        for event in events
        if event != b"[DONE]"
        for choice in orjson.loads(event).get("choices", [])
    )
    return text, bool(events) and events[-1] == b"[DONE]"


async def get_status(url: str, path: str) -> int:
    connector = aiohttp.TCPConnector(force_close=True)  # a new connection: the listener is asked each time
    async with aiohttp.ClientSession(connector=connector) as session, session.get(url + path) as resp:
        return resp.status


async def refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def start_streams(session: aiohttp.ClientSession, url: str, count: int) -> list[asyncio.Task[bytes]]:
    """`count` streams, each past its first event (so in flight at the gateway)."""
    started = [asyncio.Event() for _ in range(count)]
    tasks = [asyncio.create_task(stream(session, url, i, started[i])) for i in range(count)]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 30)
    return tasks


async def test_sigterm_lets_fifty_streams_finish_then_exits_zero(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    release = asyncio.Event()
    fake.stream_gates = [asyncio.Event(), release]  # chunk 0 flows, the rest wait for `release`
    fake.stream_gates[0].set()
    server = {"drain_grace_s": str(GRACE_S), "drain_timeout_s": str(TIMEOUT_S)}
    async with (
        gateway_process(upstream_url, tmp_path, server=server) as (proc, url),
        aiohttp.ClientSession() as session,
    ):
        assert await get_status(url, "/ready") == 200
        tasks = await start_streams(session, url, STREAMS)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)

        for _ in range(100):  # bounded: the signal is asynchronous
            if (ready := await get_status(url, "/ready")) == 503:
                break
            await asyncio.sleep(0.02)
        assert ready == 503  # the balancer stops sending here
        assert await get_status(url, "/health") == 200  # alive: no restart
        for _ in range(300):  # bounded (~15 s): the listener closes after the grace
            if await refused(url):
                break
            await asyncio.sleep(0.05)
        closed = time.monotonic()
        assert await refused(url)
        assert closed - signalled >= GRACE_S  # not before the grace
        assert proc.returncode is None  # the held streams keep the process up

        release.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        code = await asyncio.wait_for(proc.wait(), TIMEOUT_S + 10)
        exited = time.monotonic()
    assert [text_and_done(raw) for raw in results] == [("Hello, world!", True)] * STREAMS
    assert code == 0
    assert exited - signalled < TIMEOUT_S  # done when the work is done, not at the deadline
    assert fake.calls["chat"] == STREAMS


async def test_past_the_deadline_streams_are_cut_and_not_stored(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path, redis_url: str
) -> None:
    release = asyncio.Event()
    fake.stream_gates = [asyncio.Event(), release]
    fake.stream_gates[0].set()
    server = {"drain_grace_s": "0", "drain_timeout_s": "1.0"}
    l2 = {"TOKENEDGE_CACHE_REDIS_URL": redis_url}
    async with (
        gateway_process(upstream_url, tmp_path, env=l2, server=server) as (proc, url),
        aiohttp.ClientSession() as session,
    ):
        tasks = await start_streams(session, url, 3)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 15)
        exited = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 15)
    assert code == 0
    assert 1.0 <= exited - signalled < 10.0  # cut at the deadline, then cleanup
    assert all(not text_and_done(raw)[1] for raw in results)  # cut: no [DONE]

    release.set()  # a second gateway on the same Redis: the cut streams were never stored
    async with (
        gateway_process(upstream_url, tmp_path, env=l2) as (_, url),
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body(0)) as resp,
    ):
        raw = await resp.read()
        assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert text_and_done(raw) == ("Hello, world!", True)
    assert fake.calls["chat"] == 4


async def test_with_workers_the_parent_forwards_sigterm_and_every_worker_drains(
    fake: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    release = asyncio.Event()
    fake.stream_gates = [asyncio.Event(), release]
    fake.stream_gates[0].set()
    server = {"workers": "2", "drain_timeout_s": str(TIMEOUT_S)}
    async with (
        gateway_process(upstream_url, tmp_path, server=server) as (proc, url),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
    ):
        tasks = await start_streams(session, url, 8)  # a connection each: the kernel spreads them over both
        proc.send_signal(signal.SIGTERM)
        for _ in range(300):  # bounded: both workers closed their listeners (grace 0) with the streams held
            if await refused(url):
                break
            await asyncio.sleep(0.05)
        assert await refused(url) and proc.returncode is None
        release.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        code = await asyncio.wait_for(proc.wait(), TIMEOUT_S + 10)
    assert [text_and_done(raw) for raw in results] == [("Hello, world!", True)] * 8
    assert code == 0
    (log,) = tmp_path.glob("gateway-*.log")
    drained = {line.split()[2] for line in log.read_text().splitlines() if "listener closed" in line}
    assert len(drained) == 2  # both worker processes drained (each logs its pid)


async def test_a_second_sigterm_cuts_at_once(fake: FakeUpstream, upstream_url: str, tmp_path: Path) -> None:
    release = asyncio.Event()
    fake.stream_gates = [asyncio.Event(), release]
    fake.stream_gates[0].set()
    server = {"drain_timeout_s": str(TIMEOUT_S)}
    async with (
        gateway_process(upstream_url, tmp_path, server=server) as (proc, url),
        aiohttp.ClientSession() as session,
    ):
        tasks = await start_streams(session, url, 3)
        proc.send_signal(signal.SIGTERM)
        for _ in range(300):  # bounded: the drain has begun (grace 0: the listener is closed)
            if await refused(url):
                break
            await asyncio.sleep(0.05)
        assert await refused(url) and proc.returncode is None  # waiting for the held streams
        hurried = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), TIMEOUT_S)
        exited = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 15)
    release.set()
    assert code == 0
    assert exited - hurried < TIMEOUT_S / 2  # at once, not at the deadline
    assert all(not text_and_done(raw)[1] for raw in results)  # cut: no [DONE]
