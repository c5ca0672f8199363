"""Coalesced streams: one upstream stream shared by every identical streamed request while it is in flight.

A `StreamFlight` is an append-only list of SSE frames plus the upstream's head (status and headers, or an error
before the first byte). Its producer (`gateway.misses.tee`) runs in its own task, so no client owns it: a
subscriber reads the frames from index 0 (the buffer so far) and then waits for the live tail, at its own pace.
A slow client only delays itself. Lifetime rules:
- a subscriber whose connection is gone is pruned at every publish (its transport is closing), and leaves when its
  handler ends;
- with no subscriber left, the producer is cancelled and nothing is stored; with `complete_abandoned_streams` it
  keeps going for at most `abandoned_stream_max_s` (a new subscriber in that window stops the clock);
- the flight leaves the registry when it finishes, is cancelled, or its buffer passes the entry byte cap (from then
  on a new request starts its own stream, since a follower could not get every event from the start).
The registry key is the cache key: every stream asks the upstream for usage (`gateway.misses.streaming.usage`), so any
request may join any flight of its key; the usage chunk is a usage-only frame, filtered out for those that did
not ask for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.keys.policy import Outcome, Reason

Alive = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class Frame:
    data: bytes
    usage_only: bool = False  # the usage chunk: sent only to subscribers that asked for usage


@dataclass(frozen=True, slots=True)
class Head:
    """What the upstream answered before its first event: an event stream (`body` None) or a whole response."""

    status: int
    headers: Mapping[str, str]
    body: bytes | None = None


class Subscriber:
    __slots__ = ("alive",)

    def __init__(self, alive: Alive) -> None:
        self.alive = alive


class StreamFlight:
    def __init__(
        self,
        registry: StreamFlights,
        key: str,
        *,
        complete_abandoned: bool,
        abandoned_max_s: float,
    ) -> None:
        self._registry = registry
        self.key = key
        self.head: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.head.add_done_callback(_retrieve)
        # a head settled on the future itself (not through `set_head`) still wakes its waiters, a turn later
        self.head.add_done_callback(self._wake_head_waiters)
        self._head_waiters: list[asyncio.Future[None]] = []
        self.frames: list[Frame] = []
        self.done = False
        self.cancelled = False  # abandoned: the producer must not store, even if [DONE] was already read
        self.outcome: Reason | Outcome = Outcome.NOT_STORED  # for metrics and Cache-Status
        self.buffered_bytes = 0
        self._changed = asyncio.Event()
        self._subscribers: set[Subscriber] = set()
        self._complete_abandoned = complete_abandoned
        self._abandoned_max_s = abandoned_max_s
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    # producer side
    def start(self, producer: Callable[[StreamFlight], Coroutine[Any, Any, None]]) -> None:
        self._task = asyncio.create_task(producer(self))

    def set_head(self, head: Head | BaseException) -> None:
        """Settle the head (or the error before it) and wake its waiters in this same step: the producer goes on
        to publish the frames that came with the head, and each waiter runs next, once (an `asyncio.shield` over
        the future would cost each one more loop turn before its first byte)."""
        if isinstance(head, BaseException):
            self.head.set_exception(head)
        else:
            self.head.set_result(head)
        self._wake_head_waiters(self.head)

    def publish(self, frame: Frame, *, cap_bytes: int) -> None:
        self.frames.append(frame)
        self.buffered_bytes += len(frame.data)
        if self.buffered_bytes > cap_bytes:
            self._registry.remove(self)  # too big to hand to a late follower from the start
        self._wake()
        self._prune()

    def finish(self, last: bytes | None, outcome: Reason | Outcome) -> None:
        """End the flight with a final frame ([DONE] or an error event); idempotent."""
        if self.done:
            return
        if last is not None:
            self.frames.append(Frame(last))
        self.outcome = outcome
        self.done = True
        self._registry.remove(self)
        if self._timer is not None:
            self._timer.cancel()
        self._wake()

    @property
    def abandoned(self) -> bool:
        return not self._subscribers

    # subscriber side
    def subscribe(self, alive: Alive) -> Subscriber:
        sub = Subscriber(alive)
        self._subscribers.add(sub)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)
        self._check_abandoned()

    def alive(self) -> int:
        """Subscribers whose connection is still open (the rest are pruned)."""
        self._prune()
        return len(self._subscribers)

    async def wait_head(self) -> Head:
        """The upstream's head, or its error raised; cancelling this wait never cancels the flight's head."""
        if not self.head.done():
            waiter = asyncio.get_running_loop().create_future()
            self._head_waiters.append(waiter)
            await waiter
        return self.head.result()

    def _wake_head_waiters(self, _: asyncio.Future[Head]) -> None:
        waiters, self._head_waiters = self._head_waiters, []
        for waiter in waiters:
            if not waiter.done():  # a cancelled waiter's client is gone
                waiter.set_result(None)

    async def wait(self, pos: int, timeout_s: float) -> bool:
        """True once there is a frame at `pos` or the flight is done; False after `timeout_s` of silence."""
        changed = self._changed
        if pos < len(self.frames) or self.done:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            return False
        return True

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _prune(self) -> None:
        dead = [s for s in self._subscribers if not s.alive()]
        if dead:
            self._subscribers.difference_update(dead)
            self._check_abandoned()

    def _check_abandoned(self) -> None:
        if self.done or self._subscribers or self._task is None:
            return
        if not self._complete_abandoned:
            self._cancel()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._abandoned_max_s, self._cancel)

    def _cancel(self) -> None:
        self._timer = None
        self.cancelled = True
        self._registry.remove(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()


class StreamFlights:
    """The in-flight streams of one process, by cache key."""

    def __init__(self) -> None:
        self._flights: dict[str, StreamFlight] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def values(self) -> list[StreamFlight]:
        return list(self._flights.values())

    def join(self, key: str) -> StreamFlight | None:
        return self._flights.get(key)

    def start(
        self,
        key: str,
        *,
        complete_abandoned: bool,
        abandoned_max_s: float,
        producer: Callable[[StreamFlight], Coroutine[Any, Any, None]],
    ) -> StreamFlight:
        flight = StreamFlight(
            self, key, complete_abandoned=complete_abandoned, abandoned_max_s=abandoned_max_s
        )
        self._flights[flight.key] = flight
        flight.start(producer)
        return flight

    def remove(self, flight: StreamFlight) -> None:
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]


def _retrieve(future: asyncio.Future[Head]) -> None:
    if not future.cancelled():
        future.exception()  # an upstream error nobody awaits any more is not reported as lost
