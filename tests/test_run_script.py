"""`make run` (scripts/run.sh): the backend and the gateway start together, answer a miss then a hit through the
gateway, print the ports they really use, and one Ctrl-C (SIGINT) stops both. Ports come from the environment so the test never collides."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import aiohttp
import pytest

from tests.support.make_run import start_run_script, wait_ready

pytestmark = pytest.mark.slow


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


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
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) is not None
        await drain
        assert port_is_free(backend_port) and port_is_free(gateway_port)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
