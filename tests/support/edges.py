"""Real edge caches for tests: varnishd and nginx on free loopback ports, in front of a test gateway.

Each is rendered from the shipped config (`cdn/varnish/tokenedge.vcl`, `cdn/nginx/tokenedge.conf`) into a
temporary directory, started in the foreground, declared ready on its own log line (bounded by a deadline),
and stopped by the PID we started, never by name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from cdn.nginx.render import NginxEdgeConfig
from cdn.nginx.render import render as render_nginx
from cdn.varnish.render import VarnishEdgeConfig
from cdn.varnish.render import render as render_vcl
from harness.services import free_port

START_TIMEOUT_S = 15.0


class EdgeProcess:
    """A foreground server whose combined output is collected by a thread, so waits have deadlines."""

    name = "edge"

    def __init__(self, port: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"tokenedge-{self.name}-"))
        self.port = port or free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._seen = threading.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, ready: str) -> None:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.dir
        )
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        with self._seen:
            while not any(ready in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{self.name} did not start:\n{''.join(self.lines[-30:])}")
                self._seen.wait(min(left, 0.05))

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class VarnishServer(EdgeProcess):
    """`varnishd -F` with the rendered tokenedge.vcl; `-j none` so it runs unprivileged in a temp dir."""

    name = "varnish"

    def __init__(self, config: VarnishEdgeConfig, port: int | None = None) -> None:
        super().__init__(port)
        self.binary = shutil.which("varnishd") or "/usr/sbin/varnishd"
        if not Path(self.binary).exists():
            raise RuntimeError("varnishd is not installed: run `make test` (it installs it)")
        self.admin_port = free_port()
        self.vcl = self.dir / "tokenedge.vcl"
        self.vcl.write_text(render_vcl(config), encoding="utf-8")

    def command(self) -> list[str]:
        return [
            self.binary,
            "-F",
            "-j",
            "none",
            "-a",
            f"127.0.0.1:{self.port}",
            "-T",
            f"127.0.0.1:{self.admin_port}",
            "-n",
            str(self.dir / "work"),
            "-f",
            str(self.vcl),
            "-s",
            "malloc,64m",
            "-p",
            "cc_command=exec cc -O0 -fno-var-tracking -fPIC -shared -o %o %s",
            "-p",
            "thread_pools=1",
            "-p",
            "thread_pool_min=5",
        ]

    def start(self, ready: str = "said Child starts") -> None:
        super().start(ready)


class NginxServer(EdgeProcess):
    """`nginx -p DIR -c CONF` with the rendered tokenedge.conf (`daemon off`, errors to stderr)."""

    name = "nginx"

    def __init__(self, config: NginxEdgeConfig) -> None:
        super().__init__()
        self.binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(self.binary).exists():
            raise RuntimeError("nginx is not installed: run `make test` (it installs it)")
        # As root, workers would run as nobody and could not write our private temp dir: keep them as us.
        user = {"user": "root"} if os.geteuid() == 0 else {}
        self.config = NginxEdgeConfig(
            **{**_fields(config), "listen_port": self.port, "prefix": str(self.dir), **user}
        )
        self.conf = self.dir / "tokenedge.conf"
        self.conf.write_text(render_nginx(self.config), encoding="utf-8")

    def command(self) -> list[str]:
        return [self.binary, "-p", str(self.dir), "-c", str(self.conf), "-e", "stderr"]

    def start(self, ready: str = "start worker process") -> None:
        super().start(ready)


def _fields(config: NginxEdgeConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}
