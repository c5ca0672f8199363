"""Gateway replicas for scale-out tests: separate `python -m gateway` processes (one worker each) on their own
ports, sharing whatever the environment points them at (one Redis). Unlike `workers.gateway_workers`, each replica
can be killed with SIGKILL mid-request, as a crashed host would be."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.services import free_port
from harness.workers import REPO, listening_sockets


@dataclass
class Replica:
    url: str
    proc: asyncio.subprocess.Process
    log: Path

    def kill(self) -> None:
        """SIGKILL: no cleanup runs, so a lease it holds is never released (it can only expire)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)


async def start_replica(upstream_url: str, env: Mapping[str, str]) -> Replica:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="tokenedge-replica-", suffix=".log")[1])
    full_env = {
        **os.environ,
        "TOKENEDGE_UPSTREAM_URL": upstream_url,
        "TOKENEDGE_SERVER_HOST": "127.0.0.1",
        "TOKENEDGE_SERVER_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="te-mp-"),
        **env,
    }
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "--workers", "1", cwd=REPO, env=full_env, stdout=out, stderr=out
        )
    for _ in range(600):  # readiness: the port is bound (bounded, ~60 s)
        if listening_sockets(port) >= 1 or proc.returncode is not None:
            break
        await asyncio.sleep(0.1)
    if listening_sockets(port) < 1:
        proc.kill()
        raise RuntimeError(f"replica did not start:\n{log.read_text()[-3000:]}")
    return Replica(f"http://127.0.0.1:{port}", proc, log)


async def stop_replica(replica: Replica) -> None:
    if replica.proc.returncode is None:
        replica.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(replica.proc.wait(), 20)
        except TimeoutError:
            replica.proc.kill()
    await replica.proc.wait()
    with contextlib.suppress(OSError):
        replica.log.unlink()


@contextlib.asynccontextmanager
async def replicas(upstream_url: str, count: int, env: Mapping[str, str]) -> AsyncIterator[list[Replica]]:
    started = list(await asyncio.gather(*(start_replica(upstream_url, env) for _ in range(count))))
    try:
        yield started
    finally:
        await asyncio.gather(*(stop_replica(r) for r in started))
