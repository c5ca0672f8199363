"""This process's end of cache coherence: apply what others publish, publish what happens here.

Invariant: this process never serves from its L1 an entry that a purge, applied anywhere, removed, nor an entry of a
model revision it knows to be replaced. Purges reach it over the bus; while the bus is down (or has been down
since its last confirmed subscription) L1 is emptied and off (`MemoryTier.suspend`). A message it cannot read
also empties L1: dropping everything is the only safe reading of an unknown invalidation.
Order on the publishing side (`purge_everywhere`, which `gateway.handlers.admin` calls): L2 first, then this L1, then
the bus, answering once every subscribed process confirmed (P5 of docs/coherence.md), so a process that drops an
entry on the message cannot re-read it from L2; `MemoryTier.generation` stops a read that was already in flight
from back-filling or answering it (P3, P4).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.tiers.base import LocalTier
from gateway.tiers.coherence.bus import Bus, BusUnavailable
from gateway.tiers.coherence.message import (
    ACK_PREFIX,
    Invalidation,
    decode,
    decode_ack,
    encode,
    encode_ack,
    process_origin,
)
from gateway.tiers.tiered import TieredCache
from gateway.upstream.catalog import ModelCatalog

log = logging.getLogger("tokenedge.coherence")


class Coherence:
    def __init__(
        self, l1: LocalTier, catalog: ModelCatalog, bus: Bus | None, clock: Callable[[], float]
    ) -> None:
        self.l1 = l1
        self.catalog = catalog
        self.bus = bus
        self.origin = process_origin()
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._acks: dict[
            str, tuple[set[str], asyncio.Event, int]
        ] = {}  # purge id -> (ackers, all in, wanted)
        self.subscribed = False
        self.state_changed = asyncio.Event()  # set (and replaced) on every up/down: tests wait on it
        self.applied = 0  # messages from other processes applied here
        catalog.listener = self._revision_learned

    async def start(self) -> None:
        if self.bus is not None:
            self.l1.suspend()  # until the subscription is confirmed
            await self.bus.start(self)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.bus is not None:
            await self.bus.close()

    # Receiver: called by the bus.
    def up(self) -> None:
        self.l1.resume()
        self._set_subscribed(True)

    def down(self) -> None:
        self.l1.suspend()
        self._set_subscribed(False)

    def _set_subscribed(self, subscribed: bool) -> None:
        if subscribed != self.subscribed:
            self.subscribed = subscribed
            self.state_changed.set()
            self.state_changed = asyncio.Event()

    async def wait_subscribed(self, subscribed: bool) -> None:
        while self.subscribed != subscribed:
            await self.state_changed.wait()
        self.state_changed = asyncio.Event()  # set (and replaced) on every up/down: tests wait on it

    def message(self, raw: bytes) -> None:
        if raw.startswith(ACK_PREFIX):
            self._ack_received(raw)
            return
        msg = decode(raw)
        if msg is None:
            log.error("unreadable invalidation (%d bytes): emptying L1", len(raw))
            self.l1.clear()
            return
        if msg.origin == self.origin:
            return  # applied before it was published
        self.apply(msg)
        self.applied += 1
        if self.bus is not None:
            self._spawn(self.bus.ack(encode_ack(msg.id, self.origin, self._clock() - msg.sent_at)))

    def _ack_received(self, raw: bytes) -> None:
        ack = decode_ack(raw)
        waiting = self._acks.get(ack[0]) if ack is not None else None
        if ack is None or waiting is None:
            return
        ackers, done, wanted = waiting
        ackers.add(ack[1])
        if len(ackers) >= wanted:
            done.set()

    def apply(self, msg: Invalidation) -> None:
        if msg.keys:
            self.l1.delete(msg.keys)
        if msg.tags:
            self.l1.purge_tags(msg.tags)
        if msg.model is not None and msg.revision is not None:
            self.catalog.learn(msg.model, msg.revision, notify=False)  # do not echo it back on the bus
            self._drop_other_revisions(msg.model, msg.revision)

    # Publishing.
    async def publish_purge(
        self, keys: tuple[str, ...], tags: tuple[str, ...], *, ack_timeout_s: float
    ) -> int | str:
        """After L2 and this L1 are purged: tell every other process and wait (bounded) until each subscribed
        one confirms it applied the purge. The number of processes that confirmed, or "error"."""
        if self.bus is None:
            return 0
        msg = Invalidation.purge(self.origin, self._clock(), keys, tags)
        ackers: set[str] = set()
        done = asyncio.Event()
        self._acks[msg.id] = (ackers, done, 1 << 30)  # registered before publishing: no ack can be missed
        try:
            reached = await self.bus.publish(encode(msg))
            wanted = reached - (1 if self.subscribed and self.bus.name == "redis" else 0)  # Redis counts us
            self._acks[msg.id] = (ackers, done, wanted)
            if len(ackers) < wanted:
                try:
                    await asyncio.wait_for(done.wait(), ack_timeout_s)
                except TimeoutError:
                    log.warning(
                        "purge %s: %d of %d processes confirmed within %.1f s",
                        msg.id,
                        len(ackers),
                        wanted,
                        ack_timeout_s,
                    )
            return len(ackers)
        except BusUnavailable as exc:
            log.error("purge not published, other processes may keep the entries: %s", exc)
            return "error"
        finally:
            del self._acks[msg.id]

    def _revision_learned(self, model: str, old: str | None, new: str) -> None:
        log.info("model %r: revision %s -> %s", model, old, new)
        self._drop_other_revisions(model, new)
        if self.bus is not None:
            msg = Invalidation.new_revision(self.origin, self._clock(), model, new)
            self._spawn(self._publish_quietly(encode(msg)))

    async def _publish_quietly(self, raw: bytes) -> None:
        try:
            await self.bus.publish(raw)  # type: ignore[union-attr]
        except BusUnavailable as exc:  # each process still learns it from its own upstream answers and polls
            log.warning("revision change not published: %s", exc)

    def _drop_other_revisions(self, model: str, revision: str) -> None:
        """Keys carry the revision, so old entries are unreachable already; this frees their memory."""
        self.l1.purge_where(lambda entry: entry.model == model and entry.revision != revision)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def purge_everywhere(
    cache: TieredCache,
    coherence: Coherence | None,
    keys: tuple[str, ...],
    tags: tuple[str, ...],
    *,
    ack_timeout_s: float,
) -> dict[str, int | str]:
    """P5: the shared tier (P1: atomic, its epoch moved), this L1, then every other L1 over the bus (`bus`: how
    many confirmed, awaited, bounded). When this returns, no process answers an entry stored before it began."""
    result = await cache.purge(keys, tags)
    if coherence is not None and coherence.bus is not None:
        result["bus"] = await coherence.publish_purge(keys, tags, ack_timeout_s=ack_timeout_s)
    return result
