"""Loopback servers as subprocesses, for tests and benchmarks alike: a free port, a readiness poll (bounded), a
server started in its own session and stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(
    url: str,
    timeout_s: float = 30.0,
    *,
    proc: subprocess.Popen[Any] | None = None,
    interval_s: float = 0.05,
) -> None:
    """Readiness: poll until the server answers (bounded); with `proc`, a server that exits first is an error at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode}) before it answered")
        try:
            with urllib.request.urlopen(url, timeout=max(1.0, interval_s)):
                return
        except OSError:
            time.sleep(interval_s)
    raise RuntimeError(f"{url} did not come up within {timeout_s}s")


@contextmanager
def server(
    argv: Sequence[str], ready_url: str, env: Mapping[str, str] | None = None, ready_timeout_s: float = 30.0
) -> Iterator[subprocess.Popen]:
    """`argv` serving until the context ends, once `ready_url` answers. Its stderr goes to a file, never a pipe:
    a pipe nobody reads fills (64 KiB) and blocks the server's next log line, so a backend logging each request
    stalled mid-benchmark after about 600 requests (`bench gateway_miss --pairs 100`: "upstream timed out"). A
    server that exits or never answers is an error carrying its stderr's tail."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            list(argv),
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        try:
            try:
                wait_http(ready_url, ready_timeout_s, proc=proc)
            except RuntimeError as exc:
                log.seek(0)
                raise RuntimeError(f"{exc}\n{log.read()[-3000:].decode(errors='replace')}") from None
            yield proc
        finally:
            stop(proc, grace_s=10)


def stop(proc: subprocess.Popen, *, grace_s: float) -> None:
    """SIGTERM, up to `grace_s` for a graceful exit, then SIGKILL; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
