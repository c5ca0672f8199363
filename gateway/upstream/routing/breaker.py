"""A per-backend circuit breaker: passive outlier ejection with exponential backoff, then one probe at a time.

Closed: failures (connect errors, 5xx) are counted; `threshold` in a row open it for `base_s`, doubling with each
reopening up to `max_s`. Open: the backend takes no traffic until the backoff ends. Half-open: one trial request
(or a passing active health check) at a time; a success closes it and resets the backoff, a failure reopens it.
Pure state over an injected clock: no I/O, no tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    def __init__(self, *, threshold: int, base_s: float, max_s: float, clock: Callable[[], float]) -> None:
        self._threshold = threshold
        self._base_s = base_s
        self._max_s = max_s
        self._clock = clock
        self._failures = 0
        self._backoff_s = base_s
        self._open_until: float | None = None  # None: closed
        self._trial = False  # a half-open trial is in flight
        self.ejections = 0

    @property
    def state(self) -> BreakerState:
        if self._open_until is None:
            return BreakerState.CLOSED
        return BreakerState.OPEN if self._clock() < self._open_until else BreakerState.HALF_OPEN

    def available(self) -> bool:
        """May a request go here now (closed, or half-open with no trial in flight)?"""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._trial)

    def begin(self) -> None:
        """A request is sent: in half-open state it is the one trial."""
        if self.state is BreakerState.HALF_OPEN:
            self._trial = True

    def success(self) -> None:
        self._failures = 0
        if self._open_until is not None and self.state is BreakerState.HALF_OPEN:
            self._close()

    def failure(self) -> bool:
        """Count a failure; True when it ejected the backend (opened the circuit)."""
        if self._open_until is not None:
            if self.state is BreakerState.HALF_OPEN:  # the trial failed: reopen for longer
                self._backoff_s = min(self._backoff_s * 2, self._max_s)
                self._open()
                return True
            return False
        self._failures += 1
        if self._failures >= self._threshold:
            self._open()
            return True
        return False

    def _open(self) -> None:
        self._open_until = self._clock() + self._backoff_s
        self._trial = False
        self.ejections += 1

    def _close(self) -> None:
        self._open_until = None
        self._failures = 0
        self._trial = False
        self._backoff_s = self._base_s

    @property
    def open_until(self) -> float:
        return self._open_until if self._open_until is not None else 0.0
