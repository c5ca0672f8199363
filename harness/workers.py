"""`python -m gateway --workers N` as a subprocess for tests: started with environment overrides, ready when every
worker has bound the port (read from /proc/net/tcp, bounded), stopped with SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from harness.services import free_port

REPO = Path(__file__).resolve().parents[1]


def listening_sockets(port: int) -> int:
    """LISTEN sockets bound to the port: one per worker with SO_REUSEPORT (Linux /proc/net/tcp)."""
    want = f":{port:04X}"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(want) and fields[3] == "0A":
            count += 1
    return count


@contextlib.asynccontextmanager
async def gateway_workers(upstream_url: str, workers: int, env: Mapping[str, str] = {}) -> AsyncIterator[str]:
    """The base URL of a running multi-worker gateway in front of `upstream_url`."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="tokenedge-workers-", suffix=".log", delete=False)  # noqa: SIM115
    full_env = {
        **os.environ,
        "TOKENEDGE_UPSTREAM_URL": upstream_url,
        "TOKENEDGE_SERVER_HOST": "127.0.0.1",
        "TOKENEDGE_SERVER_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="te-mp-"),
        **env,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "--workers",
        str(workers),
        cwd=REPO,
        env=full_env,
        stdout=log,
        stderr=log,
    )
    try:
        for _ in range(600):  # readiness: every worker has bound the port (bounded, ~60 s)
            if listening_sockets(port) >= workers or proc.returncode is not None:
                break
            await asyncio.sleep(0.1)
        if listening_sockets(port) < workers:
            raise RuntimeError(f"workers did not start:\n{Path(log.name).read_text()[-3000:]}")
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
        os.unlink(log.name)
