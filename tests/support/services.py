"""Real services for tests: redis-server and memcached on free loopback ports, started and stopped by the test.

Readiness is read from the server's own log line, not guessed with sleeps.
"""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class RedisServer:
    """A throwaway redis-server; `stop()` and `start()` simulate an outage on the same port."""

    def __init__(self) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("redis-server is not installed: run `make test` (it installs it)")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tokenedge-redis-"))
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--loglevel",
                "notice",
                "--logfile",
                "",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for_line(self.proc, "Ready to accept connections", "redis-server")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None

    def flush(self) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        client.flushall()
        client.close()


class MemcachedServer:
    """A throwaway memcached (the Debian package); `kill()` and `start()` simulate a crash on the same port."""

    def __init__(self, max_item_bytes: int = 1024 * 1024) -> None:
        self.binary = shutil.which("memcached")
        if self.binary is None:
            raise RuntimeError("memcached is not installed: run scripts/install-system.sh")
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
