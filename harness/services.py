"""Real services for tests and benchmarks: redis-server, memcached and aiohttp apps on free loopback ports,
started and stopped by the caller.

Readiness is read from the server's own log line, not guessed with sleeps.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from harness.processes import free_port


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` on a free loopback port for the block: its base URL."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def wait_for_line(proc: subprocess.Popen[str], needle: str, what: str, max_lines: int = 500) -> None:
    assert proc.stdout is not None
    seen: list[str] = []
    for _ in range(max_lines):
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return
    proc.kill()
    raise RuntimeError(f"{what} did not start:\n{''.join(seen[-20:])}")


def redis_process(
    port: int, data_dir: Path, *options: str, what: str = "redis-server"
) -> subprocess.Popen[str]:
    """A redis-server on 127.0.0.1:`port` without persistence, logging to its stdout, returned once it accepts
    connections. `options` add to its command line (cluster mode)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run scripts/install-system.sh")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            *options,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data_dir),
            "--loglevel",
            "notice",
            "--logfile",
            "",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for_line(proc, "Ready to accept connections", what)
    return proc


def end_process(proc: subprocess.Popen[str], *, crash: bool = False) -> None:
    """SIGTERM (a shutdown) or, with `crash`, SIGKILL; then reap it and close its log pipe."""
    if crash:
        proc.kill()
    else:
        proc.terminate()
    proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


class RedisServer:
    """A throwaway redis-server; `stop()` and `start()` simulate an outage on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tokenedge-redis-"))
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = redis_process(self.port, self.dir)

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc)
            self.proc = None

    def flush(self) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        client.flushall()
        client.close()


class MemcachedServer:
    """A throwaway memcached (the Debian package); `kill()` and `start()` simulate a crash on the same port."""

    def __init__(self, max_item_bytes: int = 1024 * 1024) -> None:
        binary = shutil.which("memcached")
        if binary is None:
            raise RuntimeError("memcached is not installed: run scripts/install-system.sh")
        self.binary = binary
        self.port = free_port()
        self.max_item_bytes = max_item_bytes
        self.proc: subprocess.Popen[str] | None = None

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        # -vv is the only level that logs readiness ("server listening"); it also logs every command, so a
        # thread drains the pipe for the server's lifetime.
        self.proc = subprocess.Popen(
            [
                self.binary,
                "-l",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "0",
                "-m",
                "64",
                "-t",
                "2",
                "-I",
                str(self.max_item_bytes),
                "-u",
                getpass.getuser(),
                "-vv",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for_line(self.proc, "server listening", "memcached", max_lines=5000)
        threading.Thread(target=_drain, args=(self.proc,), daemon=True).start()

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown; every item is lost, as after a real memcached restart."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    stop = kill


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for _ in proc.stdout:
        pass
