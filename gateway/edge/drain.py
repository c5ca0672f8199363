"""Graceful shutdown on SIGTERM: a rolling update loses no work.

A balancer (a Kubernetes Service, an ingress) stops sending new requests to a replica only once it has seen the
replica unready, and that takes a few seconds to reach every proxy. So on SIGTERM or SIGINT the gateway:

1. answers `/ready` with 503 at once (`Drain.draining`) and keeps accepting for `server.drain_grace_s`;
2. then closes its listener (new connections are refused) and its idle keep-alive connections; a busy connection
   closes after the response in flight;
3. lets in-flight requests and streams finish until `server.drain_timeout_s` after the signal; whatever still runs
   then is cut: its connection is closed and its handler cancelled. A cut stream is never stored (a stream is
   stored only on clean completion, `gateway/misses/tee.py`);
4. runs the app's cleanup contexts (leases released, pools closed) and returns, so the process exits 0.

A second signal cuts at once whatever still runs (step 3 ends early): the operator's "stop now".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import web

log = logging.getLogger("tokenedge.drain")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(slots=True)
class Drain:
    """One process's shutdown: asked for by the first signal, hurried by the second."""

    grace_s: float
    timeout_s: float
    requested: asyncio.Event = field(default_factory=asyncio.Event)
    hurry: asyncio.Event = field(default_factory=asyncio.Event)
    signalled_at: float | None = None  # the loop's time of the first signal

    @property
    def draining(self) -> bool:
        return self.requested.is_set()

    def signal(self) -> None:
        """The signal handler: the first signal starts the drain, a second one cuts what still runs."""
        if self.requested.is_set():
            log.info("second signal: cutting what still runs")
            self.hurry.set()
            return
        self.signalled_at = asyncio.get_running_loop().time()
        log.info(
            "draining: /ready answers 503; the listener closes in %.1f s; in-flight work has %.1f s",
            self.grace_s,
            self.timeout_s,
        )
        self.requested.set()

    def deadline(self, now: float) -> float:
        """When in-flight work is cut: `timeout_s` after the signal (or after `now` when none came)."""
        return (self.signalled_at if self.signalled_at is not None else now) + self.timeout_s


DRAIN: web.AppKey[Drain] = web.AppKey("tokenedge_drain", Drain)


def listen(drain: Drain) -> None:
    """Route SIGTERM and SIGINT to `drain` (instead of aiohttp's handlers, which end the loop at once)."""
    loop = asyncio.get_running_loop()
    for sig in SIGNALS:
        loop.add_signal_handler(sig, drain.signal)


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Until `event` is set or `timeout_s` has passed, whichever is first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, timeout_s))


async def stop_accepting(runner: web.BaseRunner, drain: Drain) -> None:
    """Steps 1 and 2: after the grace (or a second signal), close the listeners and the idle connections."""
    await _wait(drain.hurry, drain.grace_s)
    for site in runner.sites:
        await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close; busy ones after their response
    log.info("draining: listener closed; waiting for in-flight requests")


def cut(server: web.Server | None) -> int:
    """Step 3's end: close every connection still open, which cancels its handler; how many there were."""
    connections = server.connections if server is not None else []
    for conn in connections:
        conn.force_close()
    if connections:
        log.warning("drain deadline: cut %d connection(s) still in flight", len(connections))
    return len(connections)


@contextlib.contextmanager
def cut_at_deadline(runner: web.BaseRunner, drain: Drain) -> Iterator[None]:
    """While the body runs (the runner's cleanup, which waits for in-flight handlers), cut what still runs at the
    deadline or at a second signal, whichever is first."""
    loop = asyncio.get_running_loop()
    timer = loop.call_at(drain.deadline(loop.time()), cut, runner.server)

    async def on_hurry() -> None:
        await drain.hurry.wait()
        cut(runner.server)

    hurried = loop.create_task(on_hurry(), name="tokenedge-drain-hurry")
    try:
        yield
    finally:
        timer.cancel()
        hurried.cancel()
