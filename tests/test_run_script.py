"""`make run` (scripts/run.sh): the backend and the gateway start together, answer a miss then a hit through the
gateway, print the ports they really use, and one Ctrl-C stops both: SIGINT to the whole process group, as a
terminal sends it; a supervisor's SIGTERM to the shell alone stops both too. Ports come from the environment so
the test never collides."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import aiohttp
import pytest

from tests.support.make_run import start_run_script, wait_ready

pytestmark = pytest.mark.slow


# a stop is a graceful shutdown of both servers (about 1 s idle); the bound only catches a hang
STOP_S = 60


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def group_is_empty(pgid: int) -> bool:
    """No process left in the script's group (its servers and the gateway's workers all exited)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def assert_stopped(
    proc: asyncio.subprocess.Process, status: int, backend_port: int, gateway_port: int
) -> None:
    assert await asyncio.wait_for(proc.wait(), STOP_S) == status
    assert group_is_empty(proc.pid)
    assert port_is_free(backend_port) and port_is_free(gateway_port)


async def test_run_script_serves_a_miss_then_a_hit_and_one_sigint_stops_both() -> None:
    proc, backend_port, gateway_port = await start_run_script(stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        banner = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert f"gateway http://127.0.0.1:{gateway_port} -> backend http://127.0.0.1:{backend_port}" in banner
        drain = asyncio.create_task(proc.stdout.read())  # keep the pipe from filling up
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, f"http://127.0.0.1:{backend_port}/health", proc)
            await wait_ready(session, f"http://127.0.0.1:{gateway_port}/health", proc)
            body = {
                "model": "SmolLM2-135M-Instruct",
                "temperature": 0,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            }
            statuses = []
            for _ in range(2):
                async with session.post(
                    f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": "Bearer run-test"},
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    statuses.append(resp.headers["Cache-Status"])
        assert statuses[0].startswith("tokenedge; fwd=miss; stored")
        assert statuses[1].startswith("tokenedge; hit")
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground process group
        await assert_stopped(proc, 128 + signal.SIGINT, backend_port, gateway_port)
        await drain
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def test_a_sigterm_to_the_script_alone_stops_both() -> None:
    """A supervisor signals only the shell: the servers must hear of it from the script."""
    proc, backend_port, gateway_port = await start_run_script(stdout=asyncio.subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, f"http://127.0.0.1:{backend_port}/health", proc)
            await wait_ready(session, f"http://127.0.0.1:{gateway_port}/health", proc)
        proc.send_signal(signal.SIGTERM)
        await assert_stopped(proc, 128 + signal.SIGTERM, backend_port, gateway_port)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
