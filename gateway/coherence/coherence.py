"""This process's end of cache coherence: apply what others publish, publish what happens here.

Invariant: this process never serves from its L1 an entry that a purge, applied anywhere, removed, nor an entry of a
model revision it knows to be replaced. Purges reach it over the bus; while the bus is down (or has been down
since its last confirmed subscription) L1 is emptied and off (`MemoryTier.suspend`). A message it cannot read
also empties L1: dropping everything is the only safe reading of an unknown invalidation.
Order on the publishing side (see `gateway.handlers.admin`): L2 first, then this L1, then the bus, so a process
that drops an entry on the message cannot re-read it from L2; `MemoryTier.generation` stops a read that was
already in flight from back-filling it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson

from gateway.catalog import ModelCatalog
from gateway.coherence.bus import Bus, BusUnavailable
from gateway.coherence.message import Invalidation, decode, encode, process_origin
from gateway.tiers.memory import MemoryTier

log = logging.getLogger("tokenedge.coherence")


class Coherence:
    def __init__(self, l1: MemoryTier, catalog: ModelCatalog, bus: Bus | None,
                 clock: Callable[[], float]) -> None:
        self.l1 = l1
        self.catalog = catalog
        self.bus = bus
        self.origin = process_origin()
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
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

    def down(self) -> None:
        self.l1.suspend()

    def message(self, raw: bytes) -> None:
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
            ack = orjson.dumps({"id": msg.id, "by": self.origin, "lag_s": self._clock() - msg.sent_at})
            self._spawn(self.bus.ack(ack))

    def apply(self, msg: Invalidation) -> None:
        if msg.keys:
            self.l1.delete(msg.keys)
        if msg.tags:
            self.l1.purge_tags(msg.tags)
        if msg.model is not None and msg.revision is not None:
            self.catalog.learn(msg.model, msg.revision, notify=False)  # do not echo it back on the bus
            self._drop_other_revisions(msg.model, msg.revision)

    # Publishing.
    async def publish_purge(self, keys: tuple[str, ...], tags: tuple[str, ...]) -> int | str:
        """After L2 and this L1 are purged: tell every other process. Receivers, or "error"."""
        if self.bus is None:
            return 0
        try:
            return await self.bus.publish(encode(Invalidation.purge(self.origin, self._clock(), keys, tags)))
        except BusUnavailable as exc:
            log.error("purge not published, other processes may keep the entries: %s", exc)
            return "error"

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

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
