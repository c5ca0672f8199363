"""A logger wrapper that emits at most one record per interval per topic, counting what it suppressed.

Used on failure paths that can fire on every request (a Redis outage), so an outage is visible in the log without
the log becoming the outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float, clock: Callable[[], float]) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, topic: str, message: str, *args: object) -> bool:
        now = self._clock()
        last = self._last.get(topic)
        if last is not None and now - last < self._interval_s:
            self._suppressed[topic] = self._suppressed.get(topic, 0) + 1
            return False
        suppressed = self._suppressed.pop(topic, 0)
        self._last[topic] = now
        suffix = f" ({suppressed} similar suppressed)" if suppressed else ""
        self._logger.warning(message + suffix, *args)
        return True
