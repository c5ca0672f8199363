"""Per-tenant token-rate limits: a token bucket per tenant, refilled at `tokens_per_minute / 60` per second.

Pure state with an injected clock. A request is charged its prompt tokens plus the completion tokens it asks
for (`max_tokens`, when given) at admission, the way OpenAI's own TPM limits estimate a request. A request
that cannot fit even a full bucket is refused with the time a full refill takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import LRUCache


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    retry_after_s: int = 0
    remaining: int = 0


class TokenRateLimiter:
    def __init__(
        self,
        tokens_per_minute: int,
        *,
        burst_tokens: int = 0,
        clock: Callable[[], float],
        max_tenants: int = 100_000,
    ) -> None:
        if tokens_per_minute <= 0:
            raise ValueError("tokens_per_minute must be > 0")
        self.rate_per_s = tokens_per_minute / 60.0
        self.capacity = float(burst_tokens or tokens_per_minute)
        self._clock = clock
        self._buckets: LRUCache[str, tuple[float, float]] = LRUCache(
            maxsize=max_tenants
        )  # tenant -> (level, at)

    def admit(self, tenant: str, cost: int) -> Admission:
        now = self._clock()
        level, at = self._buckets.get(tenant, (self.capacity, now))
        level = min(self.capacity, level + max(0.0, now - at) * self.rate_per_s)
        if cost > self.capacity:
            self._buckets[tenant] = (level, now)
            return Admission(False, math.ceil(self.capacity / self.rate_per_s), int(level))
        if cost > level:
            self._buckets[tenant] = (level, now)
            return Admission(False, max(1, math.ceil((cost - level) / self.rate_per_s)), int(level))
        self._buckets[tenant] = (level - cost, now)
        return Admission(True, 0, int(level - cost))
