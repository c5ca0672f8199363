"""`make run`'s script (scripts/run.sh) started for a test: its own session, ports from the environment."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp

from harness.services import free_port

ROOT = Path(__file__).resolve().parents[2]


async def start_run_script(*, stdout: int) -> tuple[asyncio.subprocess.Process, int, int]:
    """(process, backend port, gateway port); the process leads its own group, so `os.killpg` stops both."""
    backend_port, gateway_port = free_port(), free_port()
    env = {
        **os.environ,
        "TOKENEDGE_BACKEND_PORT": str(backend_port),
        "TOKENEDGE_SERVER_PORT": str(gateway_port),
        "TOKENEDGE_BACKEND_NUM_BLOCKS": "256",
    }
    proc = await asyncio.create_subprocess_exec(
        "bash",
        str(ROOT / "scripts" / "run.sh"),
        cwd=ROOT,
        env=env,
        stdout=stdout,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, backend_port, gateway_port


async def wait_ready(session: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process) -> None:
    """Readiness by polling (bounded): loading SmolLM2 takes seconds; a dead script fails at once."""
    for _ in range(2400):
        if proc.returncode is not None:
            raise AssertionError(f"run.sh exited early with {proc.returncode}")
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} not ready within 240 s")
