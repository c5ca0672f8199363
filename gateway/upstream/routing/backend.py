"""One backend behind the router: its HTTP upstream, in-flight count, circuit breaker and metric series."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.config.sections import BackendConfig, UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.http import Upstream
from gateway.upstream.routing.breaker import Breaker, BreakerState

log = logging.getLogger("tokenedge.routing")


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
        self.outstanding = 0
        self.breaker = Breaker(
            threshold=config.eject_after_failures,
            base_s=config.eject_base_s,
            max_s=config.eject_max_s,
            clock=clock,
        )
        self._metrics = metrics
        self._outstanding_gauge = metrics.outstanding.labels(target.url)
        self._up_gauge = metrics.up.labels(target.url)
        self._up_gauge.set(1)

    @property
    def url(self) -> str:
        return self.target.url

    def begin(self) -> None:
        self.outstanding += 1
        self._outstanding_gauge.inc()
        self.breaker.begin()

    def end(self) -> None:
        self.outstanding -= 1
        self._outstanding_gauge.dec()

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
        if self.breaker.failure():
            log.warning("backend %s ejected (%s)", self.url, why)
            self._metrics.ejections.labels(self.url).inc()
            self._up_gauge.set(0)
