"""Single-flight: concurrent identical misses share one upstream call.

The call runs in its own task, so a leader whose client disconnects does not cancel it for the followers; every
waiter awaits it through `asyncio.shield`. An exception reaches every waiter (no follower hangs), and the flight is
removed when the call finishes, whatever its outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")


class SingleFlight(Generic[_T]):
    def __init__(self) -> None:
        self._flights: dict[str, asyncio.Task[_T]] = {}
        self._followers: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def followers(self, key: str) -> int:
        """How many callers are waiting on the flight for `key` besides the one that started it."""
        return self._followers.get(key, 0)

    async def do(self, key: str, fn: Callable[[], Awaitable[_T]]) -> tuple[_T, bool]:
        """Run `fn` once per key at a time; returns (result, True for the caller that started it)."""
        task = self._flights.get(key)
        if task is not None:
            self._followers[key] = self._followers.get(key, 0) + 1
            try:
                return await asyncio.shield(task), False
            finally:
                self._followers[key] -= 1
                if not self._followers[key]:
                    del self._followers[key]
        task = asyncio.ensure_future(fn())
        self._flights[key] = task
        task.add_done_callback(lambda t: self._done(key, t))
        return await asyncio.shield(task), True

    def _done(self, key: str, task: asyncio.Task[_T]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # retrieved here so an error nobody awaited any more is not reported as lost
