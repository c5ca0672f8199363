"""One backend behind the router: its HTTP upstream, in-flight count, circuit breaker, metric series, and what the
cost policy learns of it (service time, what the engine reports of its own slots, the share of the prefixes it was
sent that it is seen to keep: `retention`).

An ejection resolves the backend's `ejection` future: attempts still waiting on it stop (and are retried elsewhere
when nothing reached the client), streams it is sending are cut with a clean error, and the affinity table forgets
what it was sent (`on_eject`), since it may come back empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from gateway.config.upstream import BackendConfig, UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.http import Upstream
from gateway.upstream.routing.breaker import Breaker, BreakerState
from gateway.upstream.routing.pace import Pace, Ticket
from gateway.upstream.routing.retention import Retention, Reuse

log = logging.getLogger("tokenedge.routing")

SERVICE_SEED_S = 0.5  # the service time assumed before a backend has answered anything
SERVICE_ALPHA = 0.2  # the weight of each new answer in the moving average


class Backend:
    def __init__(
        self,
        index: int,
        target: BackendConfig,
        upstream: Upstream,
        config: UpstreamConfig,
        metrics: RoutingMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.index = index
        self.target = target
        self.upstream = upstream
        self.name = target.name or urlsplit(target.url).netloc or target.url
        self.outstanding = 0
        # tokenizer calls in flight: beside `outstanding`, never in `load` (`facts.LIGHT_PATHS`)
        self.light = 0
        self.service_s = SERVICE_SEED_S
        self.pace = Pace(1.0 / target.prefill_tokens_per_s)  # its queue and prefill rate (the cost policy's)
        self.foreign_busy = (
            0  # busy slots the engine reported beyond our own requests (other replicas, clients)
        )
        self.reported_slots = 0  # 0: it never said (llama-server's /slots, our backend's /metrics)
        self.has_slots = True  # False once it answered /slots with something else (not llama-server)
        self.has_metrics = True  # False once its /metrics named no engine load gauge
        self.retention = Retention()  # kept across an ejection: a restarted engine is likely the same kind
        self.on_eject: Callable[[int], None] | None = None
        self.breaker = Breaker(
            threshold=config.eject_after_failures,
            base_s=config.eject_base_s,
            max_s=config.eject_max_s,
            clock=clock,
        )
        self._ejection: asyncio.Future[None] | None = None
        self._metrics = metrics
        self._outstanding_gauge = metrics.outstanding.labels(target.url)
        self._up_gauge = metrics.up.labels(target.url)
        self._up_gauge.set(1)
        self._retention_gauge = metrics.retention.labels(target.url)
        self._retention_gauge.set(1.0)

    @property
    def url(self) -> str:
        return self.target.url

    @property
    def slots(self) -> int:
        return self.target.slots or self.reported_slots or 1

    @property
    def load(self) -> int:
        """Requests it is running or queueing: ours, plus the others it reported at its last check."""
        return self.outstanding + self.foreign_busy

    @property
    def saturated(self) -> bool:
        cap = self.target.max_outstanding
        return cap > 0 and self.outstanding >= cap

    def ejection(self) -> asyncio.Future[None]:
        """Resolved when this backend is next ejected."""
        if self._ejection is None or self._ejection.done():
            self._ejection = asyncio.get_running_loop().create_future()
        return self._ejection

    def begin(self, unmatched: int = 0, *, light: bool = False) -> Ticket:
        """One attempt sent, with `unmatched` prompt tokens the engine is expected to prefill; a `light` one (a
        tokenizer call) takes no slot: it joins no queue and its times teach nothing."""
        self.breaker.begin()
        if light:
            self.light += 1
            return Ticket(time.monotonic(), 0.0, 0, idle=False, light=True)
        idle = self.outstanding == 0 and self.foreign_busy == 0
        self.outstanding += 1
        self._outstanding_gauge.inc()
        return self.pace.begin(time.monotonic(), unmatched, idle=idle)

    def end(self, ticket: Ticket) -> None:
        if ticket.light:
            self.light -= 1
            return
        self.outstanding -= 1
        self._outstanding_gauge.dec()
        self.pace.end(ticket, time.monotonic())

    def first_byte(self, ticket: Ticket) -> None:
        """A stream's first body chunk came (its time to first token teaches the prefill rate)."""
        ticket.first_byte = time.monotonic()

    def served(self, ticket: Ticket) -> None:
        """The attempt was answered (below 500), now: the mean service time behind the engine's other load."""
        ticket.ok = True
        if not ticket.light:
            self.service_s += SERVICE_ALPHA * (time.monotonic() - ticket.sent - self.service_s)

    def reused(self, matched: int, prompt: int, reuse: Reuse | None) -> None:
        """An answer said it reused `reuse` of a prompt of `prompt` tokens (the router's estimate), of which the
        router expected `matched`: evidence of what the engine keeps."""
        if self.retention.observe(matched, prompt, reuse):
            self._retention_gauge.set(self.retention.value)

    def succeeded(self) -> None:
        self._metrics.requests.labels(self.url, "ok").inc()
        was_open = self.breaker.state is not BreakerState.CLOSED
        self.breaker.success()
        if was_open and self.breaker.state is BreakerState.CLOSED:
            log.info("backend %s is back", self.url)
            self._up_gauge.set(1)

    def probe_ok(self) -> None:
        """An active health check passed: like a success, without counting a request."""
        if self.breaker.state is not BreakerState.CLOSED:  # closed: requests' own failures keep counting
            self.breaker.success()
            if self.breaker.state is BreakerState.CLOSED:
                log.info("backend %s is back (health check)", self.url)
                self._up_gauge.set(1)

    def failed(self, why: str, *, retried: bool) -> None:
        self._metrics.requests.labels(self.url, "retried" if retried else "error").inc()
        self.fault(why)

    def fault(self, why: str) -> None:
        """A failure that counts towards ejection (a request's, a health check's, a missed first-byte deadline)."""
        if self.breaker.failure():
            log.warning("backend %s ejected (%s)", self.url, why)
            self._metrics.ejections.labels(self.url).inc()
            self._up_gauge.set(0)
            self.foreign_busy = 0
            if self._ejection is not None and not self._ejection.done():
                self._ejection.set_result(None)
            if self.on_eject is not None:
                self.on_eject(self.index)
