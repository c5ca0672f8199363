"""Retries with exponential backoff and full jitter, honouring Retry-After, for every purge request.

The decision (`retry_delay_s`) is a pure function; `RetryingSender` is the thin async driver around a
`Transport`. Retried: 429, any 5xx, timeouts and connection errors. Never retried: other 4xx (the request
itself is wrong; repeating it cannot help). Sleep and randomness are injected so tests never sleep.
Everything this module logs or returns passes through the caller's redactor first.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from cdn.purge.redact import Redactor
from cdn.purge.transport import HttpRequest, HttpResponse, Transport, TransportError

__all__ = [
    "Outcome",
    "RetryPolicy",
    "RetryingSender",
    "is_retryable_status",
    "parse_retry_after_s",
    "retry_delay_s",
]

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


class Uniform(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    max_retry_after_s: float = 60.0
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")
        if self.max_retry_after_s < 0 or self.timeout_s <= 0:
            raise ValueError("max_retry_after_s must be >= 0 and timeout_s > 0")


@dataclass(frozen=True, slots=True)
class Outcome:
    """The last response (if any), the redacted error of the last attempt (if it failed), attempts made."""

    response: HttpResponse | None
    error: str | None
    attempts: int


def is_retryable_status(status: int) -> bool:
    return status == 429 or 500 <= status <= 599


def parse_retry_after_s(value: str | None, now_s: float) -> float | None:
    """RFC 9110 §10.2.3: delay-seconds or an HTTP-date. Unparseable -> None (fall back to backoff)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_s)


def retry_delay_s(
    policy: RetryPolicy, attempt: int, retry_after_s: float | None, rng: Uniform
) -> float | None:
    """Seconds to wait before attempt `attempt + 1`, or None when `attempt` was the last one allowed.

    A server's Retry-After wins (capped by max_retry_after_s); otherwise full jitter over an exponential
    ceiling: uniform(0, min(max_delay_s, base_delay_s * 2**(attempt-1))).
    """
    if attempt >= policy.max_attempts:
        return None
    if retry_after_s is not None:
        return min(retry_after_s, policy.max_retry_after_s)
    ceiling = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1))
    return rng.uniform(0.0, ceiling)


class RetryingSender:
    """Sends one request with retries; never raises for HTTP or transport failures."""

    __slots__ = ("_clock", "_name", "_policy", "_redact", "_rng", "_sleep", "_transport")

    def __init__(
        self,
        name: str,
        transport: Transport,
        policy: RetryPolicy,
        redact: Redactor,
        *,
        sleep: Sleep = asyncio.sleep,
        rng: Uniform | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._name = name
        self._transport = transport
        self._policy = policy
        self._redact = redact
        self._sleep = sleep
        self._rng: Uniform = rng if rng is not None else random.Random()
        self._clock = clock

    async def send(self, request: HttpRequest) -> Outcome:
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            response: HttpResponse | None = None
            try:
                response = await self._transport.send(request, self._policy.timeout_s)
            except TransportError as exc:
                error = self._redact(f"{request.method} {request.url}: {exc}")
            else:
                if not is_retryable_status(response.status):
                    return Outcome(response=response, error=None, attempts=attempt)
                error = self._redact(f"{request.method} {request.url}: HTTP {response.status}")
                retry_after = parse_retry_after_s(response.headers.get("retry-after"), self._clock())
            delay = retry_delay_s(self._policy, attempt, retry_after, self._rng)
            if delay is None:
                logger.warning("%s: giving up after %d attempts: %s", self._name, attempt, error)
                return Outcome(response=response, error=error, attempts=attempt)
            logger.info("%s: attempt %d failed (%s); retrying in %.2fs", self._name, attempt, error, delay)
            await self._sleep(delay)
