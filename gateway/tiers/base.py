"""The tier seams: what `TieredCache` needs from the in-process L1 and from a shared L2 (Redis or Memcached).

Two protocols, not one: L1 is read synchronously on the hottest path (an L1 hit must not pay for a coroutine),
while a shared tier is remote and async. Both speak `Entry` and the same purge vocabulary (keys and tags).
Both carry the purge discipline of docs/coherence.md: L1 a purge `generation` (P3, P4), a shared tier a purge
`epoch` that a store started under and that the tier checks atomically with the write (P1, P2).
A shared tier never raises anything but `L2Unavailable` out of an operation: every failure goes through one
`Breaker`, which counts it (`cache_errors_total{tier="l2"}`), logs at a bounded rate and skips the tier for
`retry_after_s`, so an outage costs one timeout per window instead of one per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from gateway.keys.entry import Entry
from gateway.ops.ratelog import RateLimitedLog

_T = TypeVar("_T")
# A shared tier's purge epoch as its `epoch` took it (opaque outside the tier: Redis' epoch value, Memcached's tag
# versions); only that tier's `set` reads it.
Epoch = object


class L2Unavailable(Exception):
    """L2 is skipped (breaker open) or the operation failed; callers treat it as a miss."""


class LocalTier(Protocol):
    """The in-process tier (L1): synchronous, per worker. `generation` changes on every purge, so a read begun
    before one (an L2 read about to back-fill) can tell; `suspend`/`resume` serve the invalidation bus."""

    name: str
    generation: int

    @property
    def enabled(self) -> bool: ...

    def get(self, key: str) -> Entry | None: ...

    def set(self, entry: Entry, *, generation: int | None = None) -> bool: ...

    def delete(self, keys: Iterable[str]) -> int: ...

    def purge_tags(self, tags: Iterable[str]) -> int: ...

    def purge_where(self, doomed: Callable[[Entry], bool]) -> int: ...

    def clear(self) -> None: ...

    def suspend(self) -> None: ...

    def resume(self) -> None: ...

    def entries(self) -> int: ...

    def bytes_used(self) -> int: ...

    @property
    def evictions(self) -> int: ...


class Tier(Protocol):
    """A shared tier (L2). Operations raise only `L2Unavailable`; `available` is False while the breaker is open."""

    name: str

    @property
    def available(self) -> bool: ...

    async def get(self, key: str) -> Entry | None: ...

    def read(self, key: str) -> asyncio.Future[Any]:
        """`get` without the coroutine, for a callback to wait on: the tier's raw value (`entry_of` makes it an
        entry); raises L2Unavailable at once while the breaker is open."""
        ...

    def entry_of(self, value: Any) -> Entry | None: ...

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]: ...

    async def epoch(self, key: str, tags: Sequence[str]) -> Epoch:
        """P2: the purge epoch a store of `key` (tagged `tags`) starts under, taken before the upstream call."""
        ...

    async def set(self, entry: Entry, epoch: Epoch) -> bool:
        """True when stored; False when the tier refused the entry (counted by the tier: too large, or `purged`
        when a purge moved the epoch since `epoch` was taken, P2: then it is never written)."""
        ...

    async def delete(self, keys: Iterable[str]) -> int: ...

    async def purge_tags(self, tags: Iterable[str]) -> tuple[int, list[str]]:
        """(count, keys): what was purged, and the keys when the tier can list them (else empty)."""
        ...

    async def ping(self) -> bool: ...

    async def stats(self) -> tuple[int, int] | None: ...

    async def close(self) -> None: ...


class Breaker:
    """The one degrade path of a shared tier: run an operation with a deadline, or count, log and open."""

    def __init__(
        self,
        *,
        label: str,
        errors: tuple[type[BaseException], ...],
        timeout_s: float,
        retry_after_s: float,
        clock: Callable[[], float],
        on_error: Callable[[], None],
        log: logging.Logger,
    ) -> None:
        self._label = label
        self._errors: tuple[type[BaseException], ...] = (*errors, OSError, TimeoutError)
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._on_error = on_error
        self._open_until = 0.0
        self._log = RateLimitedLog(log, 10.0, clock)

    @property
    def available(self) -> bool:
        return self._clock() >= self._open_until

    async def call(self, op: str, fn: Callable[[], Awaitable[_T]]) -> _T:
        if not self.available:
            raise L2Unavailable(f"l2 skipped for {op}: breaker open")
        try:
            async with asyncio.timeout(self._timeout_s):  # no task per call, unlike wait_for (Python 3.11)
                return await fn()
        except self._errors as exc:
            self.trip(op, exc)
            raise L2Unavailable(f"l2 {op} failed: {exc}") from exc

    def trip(self, op: str, exc: BaseException) -> None:
        self._on_error()
        self._open_until = self._clock() + self._retry_after_s
        self._log.warning(
            self._label,
            "L2 (%s) %s failed, serving from L1/upstream: %s: %s",
            self._label,
            op,
            type(exc).__name__,
            exc,
        )


def settle_batch(
    batch: dict[str, list[asyncio.Future[_T]]],
    results: Iterable[_T] | None,
    error: BaseException | None = None,
) -> None:
    """Hand each waiter of a batched read its key's result (in `batch` order), or `error` to all of them; a
    waiter that gave up (cancelled) is skipped."""
    if results is None:
        for futures in batch.values():
            for future in futures:
                if not future.done():
                    future.set_exception(L2Unavailable(str(error)))
        return
    for futures, result in zip(batch.values(), results, strict=True):
        for future in futures:
            if not future.done():
                future.set_result(result)
