"""One `llama-server` process (a build from harness.peers.llamacpp_build) on a free loopback port, for the
benchmarks and the test suite: started with a GGUF and an alias, ready once its own log says it listens (it starts listening only after
the model has loaded), stopped at the end of the block. Its log is drained by a thread so the pipe never fills.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.peers.llamacpp_build import LlamaBuild
from harness.processes import stop

READY = "listening on http://"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LlamaServer:
    url: str  # http://127.0.0.1:PORT, without /v1
    build: LlamaBuild
    argv: list[str]
    pid: int = 0  # the process (for signals: a test stops, continues or kills it)
    log: list[str] = field(default_factory=list)


def _drain(proc: subprocess.Popen[str], log: list[str], outcome: list[str], told: threading.Event) -> None:
    """Keep the log; say `ready` at the listening line, or `exited` at EOF if it never came."""
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)
        if READY in line and not outcome:
            outcome.append("ready")
            told.set()
    if not outcome:
        outcome.append("exited")
    told.set()


@contextmanager
def llama_server(
    build: LlamaBuild,
    model: Path,
    *,
    alias: str,
    slots: int = 1,
    threads: int = 2,
    ctx_per_slot: int = 2048,
    metrics: bool = False,
    ready_timeout_s: float = 180.0,
    extra_args: tuple[str, ...] = (),
    port: int = 0,
) -> Iterator[LlamaServer]:
    """`llama-server` serving `model` as `alias` with `slots` parallel sequences (and its Prometheus
    `/metrics` where `metrics`, and `extra_args` after the rest, e.g. `--chat-template-file`), on `port` (0: a
    free one; a fixed one restarts an engine where its clients expect it); raises RuntimeError with its log
    when it exits or stays silent instead of listening."""
    port = port or free_port()
    argv = [
        str(build.server),
        *("-m", str(model), "--alias", alias, "--host", "127.0.0.1", "--port", str(port)),
        *("-np", str(slots), "-c", str(ctx_per_slot * slots), "-t", str(threads), "-tb", str(threads)),
        *(["--metrics"] if metrics else []),
        *extra_args,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    running = LlamaServer(f"http://127.0.0.1:{port}", build, argv, proc.pid)
    outcome: list[str] = []
    told = threading.Event()
    drainer = threading.Thread(target=_drain, args=(proc, running.log, outcome, told), daemon=True)
    drainer.start()
    try:
        if not told.wait(ready_timeout_s) or outcome != ["ready"]:
            tail = "".join(running.log[-30:])
            raise RuntimeError(f"llama-server did not start ({' '.join(argv)}):\n{tail}")
        yield running
    finally:
        stop(proc, grace_s=15)
        drainer.join(timeout=5)
