"""Failover on real engines (issue 37's acceptance), for the test suite and `python -m bench failover` alike.

Two native `llama-server` processes (one slot, one thread each) behind one in-process gateway, a steady load
of unique misses (JSON and streams alternating, `harness.failover_load`), and two faults mid-run, each hitting
the engine a long stream is flowing from, with a burst of requests queued behind it:
1. SIGKILL: the engine dies; later it is restarted empty on the same port.
2. SIGSTOP for `stall_s`, then SIGCONT: the engine hangs (it still completes TCP handshakes).
Measured, from the gateway's own state (the breakers, `X-Tokenedge-Backend`): each ejection's delay after the
signal, each engine's answers per second with both up (its normal rate) and the healthy one's while the other
was out, how long the restored engine took to be readmitted and which engines served the requests sent after
that, how every request ended, and whether anything a failed stream would have stored is in the cache.

Every wait is a bounded poll on a condition; the one plain wait is the stall itself (the fault's length).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.breaker import BreakerState
from gateway.upstream.routing.pool import UpstreamPool
from harness.failover_load import ALIAS, Load, Outcome, served_by
from harness.gateway import RunningGateway
from harness.peers.llama_server import LlamaServer, llama_server
from harness.peers.llamacpp_build import LlamaBuild
from harness.processes import ROOT

# The test's deadlines: a hung engine is found by two 1 s health checks (0.25 s apart), well inside the 5 s
# first-byte deadline; an ejection lasts 0.5 s, doubling up to 2 s, so a restored engine is probed again soon.
FAST_DEADLINES: dict[str, Any] = {
    "read_timeout_s": 60.0,
    "health_interval_s": 0.25,
    "health_timeout_s": 1.0,
    "eject_after_failures": 2,
    "eject_base_s": 0.5,
    "eject_max_s": 2.0,
    "first_byte_timeout_s": 5.0,
}
DEADLINE_KEYS = (*FAST_DEADLINES, "connect_timeout_s")


def shipped_deadlines() -> dict[str, Any]:
    """The same keys as configs/gateway.toml ships them (what a new user runs)."""
    with (ROOT / "configs" / "gateway.toml").open("rb") as f:
        upstream = tomllib.load(f)["upstream"]
    return {k: upstream[k] for k in DEADLINE_KEYS}


@dataclass(frozen=True)
class Plan:
    stall_s: float = 15.0  # how long the SIGSTOP lasts (the acceptance's number)
    baseline_n: int = 20  # answers with both engines up that set each one's normal rate
    after_n: int = 30  # requests counted after each recovery (the "0 of the last 30")
    alone_n: int = 12  # answers by the survivor before the killed engine is restarted
    concurrency: int = 2  # clients of the steady load
    burst: int = 4  # extra requests sent as a fault hits, so the victim has some queued
    max_tokens: int = 8
    long_tokens: int = 400  # the stream flowing from the victim
    limit_s: float = 60.0  # one request's bound: longer is a hang
    wait_s: float = 60.0  # any wait on the fleet


class Engine:
    """One llama-server that a fault can kill and a restart brings back, empty, on the same port."""

    def __init__(self, build: LlamaBuild, model: Path) -> None:
        self.build, self.model = build, model
        self.port = 0
        self.server: LlamaServer | None = None
        self._stack = ExitStack()

    def start(self) -> None:
        """Blocking until it listens (call it from a thread while a loop is serving)."""
        self._stack = ExitStack()
        self.server = self._stack.enter_context(
            llama_server(
                self.build, self.model, alias=ALIAS, slots=1, threads=1, metrics=True, port=self.port
            )
        )
        self.port = urlsplit(self.server.url).port or 0

    @property
    def url(self) -> str:
        assert self.port, "not started yet"
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        """What `X-Tokenedge-Backend` calls it."""
        return self.url.removeprefix("http://")

    def signal(self, sig: signal.Signals) -> None:
        assert self.server is not None
        os.kill(self.server.pid, sig)

    def close(self) -> None:
        """Stopped and reaped (its port is kept for a restart)."""
        self._stack.close()
        self.server = None


@contextmanager
def fleet(build: LlamaBuild, model: Path, n: int = 2) -> Iterator[list[Engine]]:
    engines = [Engine(build, model) for _ in range(n)]
    try:
        for engine in engines:
            engine.start()
        yield engines
    finally:
        for engine in engines:
            with_cont(engine)
            engine.close()


def with_cont(engine: Engine) -> None:
    """A stopped engine cannot exit on SIGTERM: continue it first (harmless when running or gone)."""
    if engine.server is not None:
        with suppress(ProcessLookupError):
            engine.signal(signal.SIGCONT)


def upstream_section(engines: list[Engine], deadlines: dict[str, Any]) -> dict[str, Any]:
    return {"url": ",".join(e.url for e in engines), "model_revision": "llama.cpp-failover", **deadlines}


async def until(condition: Callable[[], bool], limit_s: float, what: str) -> float:
    """Poll `condition` (bounded); the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > limit_s:
            raise TimeoutError(f"{what}: not within {limit_s:g} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@dataclass
class Fault:
    """One fault and what followed it."""

    signal: str
    victim: str
    healthy: str
    hit_at: float = 0.0  # time.monotonic() of the signal
    queued: int = 0  # requests the gateway had on the victim when it was hit (the long stream included)
    ejected_s: float = 0.0  # from the signal to the victim's ejection
    out_s: float = 0.0  # from the signal to the restart or SIGCONT
    healthy_rate: float = (
        0.0  # the healthy engine's answers per second from the signal to the restart/SIGCONT
    )
    back_s: float = 0.0  # from the restart (listening) or SIGCONT to readmission (circuit closed)
    readmitted_at: float = 0.0
    first_after_s: float = 0.0  # from readmission to the first request the restored engine answered
    after: list[str] = field(
        default_factory=list
    )  # engines of the first `after_n` requests sent then, in order
    worst_json_s: float = 0.0  # the longest JSON answer that ended while the victim was out
    long_stream: Outcome | None = None

    def share(self, first: int = 0) -> float:
        """The victim's share of the requests after recovery (of the `first` ones; 0: all counted)."""
        engines = self.after[:first] if first else self.after
        return engines.count(self.victim) / len(engines)


@dataclass
class Report:
    engines: list[str]
    baseline: dict[str, float]  # answers per second per engine, both up
    kill: Fault
    stall: Fault
    outcomes: list[Outcome]
    stored_after_error: int = 0  # cache entries under the keys of streams that ended with an error
    stored_done: int = 0  # cache entries under the keys of streams that completed (the look-up works)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        def fault(f: Fault) -> dict[str, Any]:
            return {
                "queued_on_victim": f.queued,
                "ejected_s": round(f.ejected_s, 2),
                "out_s": round(f.out_s, 2),
                "healthy_rate": round(f.healthy_rate, 2),
                "healthy_normal_rate": round(self.baseline[f.healthy], 2),
                "worst_json_s": round(f.worst_json_s, 2),
                "readmitted_s": round(f.back_s, 2),
                "restored_after": f"{f.after.count(f.victim)}/{len(f.after)}",
                "restored_first_10": f"{f.after[:10].count(f.victim)}/10",
                "restored_first_request_s": round(f.first_after_s, 2),
                "long_stream": "error event" if f.long_stream and f.long_stream.error else "not cut",
            }

        kinds = Counter(o.kind for o in self.outcomes)
        return {
            "requests": dict(kinds),
            "failed_json": sum(1 for o in self.outcomes if o.kind == "json" and not o.ok),
            "streams_error_event": sum(1 for o in self.outcomes if o.kind == "stream" and o.error),
            "streams_unclean": sum(1 for o in self.outcomes if o.kind == "stream" and not o.clean),
            "stored_after_error": self.stored_after_error,
            "stored_done": self.stored_done,
            "baseline_rate": {k: round(v, 2) for k, v in self.baseline.items()},
            "kill": fault(self.kill),
            "stall": fault(self.stall),
            "wall_s": round(self.wall_s, 1),
        }


class Run:
    """One failover run: the gateway's pool, the engines, the load."""

    def __init__(self, gw: RunningGateway, engines: list[Engine], load: Load, plan: Plan) -> None:
        pool = gw.state.upstream
        assert isinstance(pool, UpstreamPool), "the gateway must route over several engines"
        self.gw, self.pool, self.engines, self.load, self.plan = gw, pool, engines, load, plan

    def backend(self, engine: Engine) -> Backend:
        return next(b for b in self.pool.backends if b.name == engine.name)

    def other(self, engine: Engine) -> Engine:
        return next(e for e in self.engines if e is not engine)

    async def baseline(self) -> dict[str, float]:
        """Each engine's answers per second with both up, over the next `baseline_n` answers."""
        started = time.monotonic()
        await until(
            lambda: sum(o.ok for o in self.load.ended(started)) >= self.plan.baseline_n,
            self.plan.wait_s,
            "the baseline's answers",
        )
        ended = time.monotonic()
        answers = self.load.ended(started, ended)
        return {e.name: served_by(answers, e.name) / (ended - started) for e in self.engines}

    async def strike(self, sig: signal.Signals) -> tuple[Engine, Fault, asyncio.Future[Any]]:
        """Open a long stream, queue a burst behind it, and signal the engine it flows from once that engine
        holds more than the stream; the fault, its victim, and the burst (still running)."""
        flowing: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        long = asyncio.ensure_future(
            self.load.one(stream=True, max_tokens=self.plan.long_tokens, flowing=flowing)
        )
        name = await asyncio.wait_for(flowing, self.plan.wait_s)
        victim = next(e for e in self.engines if e.name == name)
        backend = self.backend(victim)
        burst = asyncio.ensure_future(self.load.burst(self.plan.burst))
        await until(lambda: backend.outstanding >= 2, self.plan.wait_s, f"a request queued on {name}")
        fault = Fault(sig.name, victim.name, self.other(victim).name, queued=backend.outstanding)
        before = backend.breaker.ejections
        fault.hit_at = time.monotonic()
        victim.signal(sig)
        fault.ejected_s = await until(
            lambda: backend.breaker.ejections > before, self.plan.wait_s, f"{name} ejected after {sig.name}"
        )
        fault.long_stream = await asyncio.wait_for(long, self.plan.limit_s)
        return victim, fault, burst

    async def recovered(self, victim: Engine, fault: Fault, back: float) -> None:
        """Readmission of `victim` (from `back`), then the engines of the next `after_n` requests."""
        backend, plan = self.backend(victim), self.plan
        await until(
            lambda: backend.breaker.state is BreakerState.CLOSED, plan.wait_s, f"{victim.name} readmitted"
        )
        readmitted = fault.readmitted_at = time.monotonic()
        fault.back_s = readmitted - back

        def counted() -> list[Outcome]:
            return self.load.started(readmitted)[: plan.after_n]

        await until(
            lambda: len(counted()) == plan.after_n and all(o.ended for o in counted()),
            plan.wait_s,
            "the requests after recovery",
        )
        fault.after = [o.backend for o in counted()]
        first = next((o for o in self.load.started(readmitted) if o.backend == victim.name), None)
        fault.first_after_s = first.started - readmitted if first else float("inf")

    def rate_while_out(self, fault: Fault, back: float) -> None:
        fault.out_s = back - fault.hit_at
        ended = self.load.ended(fault.hit_at, back)
        fault.healthy_rate = served_by(ended, fault.healthy) / fault.out_s
        fault.worst_json_s = max((o.ended - o.started for o in ended if o.kind == "json"), default=0.0)

    async def kill(self) -> Fault:
        """SIGKILL; the survivor serves alone for `after_n` answers; the victim restarts empty on its port."""
        victim, fault, burst = await self.strike(signal.SIGKILL)
        await asyncio.to_thread(victim.close)  # reaped
        await until(
            lambda: served_by(self.load.ended(fault.hit_at), fault.healthy) >= self.plan.alone_n,
            self.plan.wait_s,
            "answers from the survivor",
        )
        await burst
        await asyncio.to_thread(victim.start)
        back = time.monotonic()
        self.rate_while_out(fault, back)
        await self.recovered(victim, fault, back)
        return fault

    async def stall(self) -> Fault:
        """SIGSTOP for `stall_s` (from the signal), then SIGCONT."""
        victim, fault, burst = await self.strike(signal.SIGSTOP)
        try:
            await burst
            await asyncio.sleep(
                max(0.0, fault.hit_at + self.plan.stall_s - time.monotonic())
            )  # the fault's length
        finally:
            victim.signal(signal.SIGCONT)
        back = time.monotonic()
        self.rate_while_out(fault, back)
        await self.recovered(victim, fault, back)
        return fault

    async def stored(self, *, ok: bool) -> int:
        """Entries the cache holds under the keys of streams that completed (`ok`) or did not: design §4
        stores a stream only after its [DONE], with no error event."""
        keys = {o.key for o in self.load.outcomes if o.kind == "stream" and o.ok == ok and o.key}
        return sum([await self.gw.state.cache.get(key) is not None for key in keys])


async def scenario(gw: RunningGateway, engines: list[Engine], plan: Plan) -> Report:
    """The whole run: baseline, SIGKILL and restart, SIGSTOP and SIGCONT, under one steady load."""
    started = time.monotonic()
    pool = gw.state.upstream
    assert isinstance(pool, UpstreamPool)
    await until(lambda: all(b.reported_slots >= 1 for b in pool.backends), plan.wait_s, "the engines' /slots")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        load = Load(session, gw.url, max_tokens=plan.max_tokens, limit_s=plan.limit_s)
        run = Run(gw, engines, load, plan)
        load.start(plan.concurrency)
        try:
            baseline = await run.baseline()
            kill = await run.kill()
            stall = await run.stall()
        finally:
            await load.stop()
    report = Report([e.name for e in engines], baseline, kill, stall, load.outcomes)
    report.stored_after_error = await run.stored(ok=False)
    report.stored_done = await run.stored(ok=True)
    report.wall_s = time.monotonic() - started
    return report
