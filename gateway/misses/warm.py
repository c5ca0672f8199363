"""Warm-up of a new replica: fill L1 from L2 with the hottest entries before `/ready` says yes.

On start (one cleanup_ctx, Redis L2 with `cache.hot_record_enabled` only) the replica reads the
`cache.warm_fill_top` hottest keys of the shared hot-key record (gateway/tiers/hotrecord.py), fetches their entries from
L2 in batches (`get_many`, batched per node on a cluster) and puts the fresh ones in its L1, coldest first so that
an L1 smaller than the fill keeps the hottest. `/ready` answers 503 `warming` until the fill is done or
`cache.warm_fill_timeout_s` has passed (then it says yes with whatever was filled: warm-up delays readiness, it
never prevents it). An L2 error ends the fill early, the same way. Entries of an old model revision may be filled;
they are never looked up (keys include the revision), only the L1 budget pays for them.

The same ctx owns the hot-key record's flusher; `count_store` is the fill's hook and `gateway.hits.record` the
hits': a dict increment each (no I/O on the request path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from prometheus_client import Counter

from gateway.keys.entry import Entry
from gateway.misses.answer import FillRequest
from gateway.misses.needs import MissState
from gateway.tiers.base import L2Unavailable, Tier
from gateway.tiers.hotrecord import HotRecord, HotSettings, Replayable, Warmup
from gateway.tiers.redis_cluster import REDIS_FAILURES, command_client

# an L2 that cannot answer ends the fill early (readiness is delayed, never prevented)
FILL_FAILURES: tuple[type[BaseException], ...] = (L2Unavailable, *REDIS_FAILURES)
log = logging.getLogger("tokenedge.warm")
FILL_BATCH = 200
READY_WAIT_S = 0.5  # how long one /ready call waits for a running fill before it answers `warming`


def hot_record_of(state: MissState) -> HotRecord | None:
    return state.hot_record


async def warming(state: MissState, wait_s: float = READY_WAIT_S) -> bool:
    """True while the start-up fill runs (bounded by `cache.warm_fill_timeout_s`), after waiting up to `wait_s`
    for it: a small fill answers the first probe `ready`, a large one answers `warming` without holding the probe."""
    warmup = state.warmup
    if warmup is None or warmup.done.is_set():
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(warmup.done.wait(), wait_s)
    return not warmup.done.is_set()


def count_store(state: MissState, req: FillRequest) -> None:
    record = hot_record_of(state)
    # A query string is never written to the shared tier: it may carry a credential (`?key=`), and a request
    # re-asked without it would be another request (gateway.keys.parts).
    if record is not None and "?" not in req.path_qs:
        record.stored(
            Replayable(req.key.key, req.endpoint, req.path_qs, req.model, req.revision, req.body),
            req.key.scope,
        )


async def fill_l1(state: MissState, record: HotRecord, top: int, warmup: Warmup) -> None:
    """Read the `top` hottest keys' entries from L2 into L1, coldest first; counts what it put in `warmup`.

    Each batch is back-filled under the L1 generation taken before its read (P3, docs/coherence.md): a purge that
    reached this L1 meanwhile refuses it. Then the filled keys are read once more and any entry gone or changed in
    L2 is dropped from L1: that also catches a purge whose invalidation never reached this L1 (published nowhere,
    or before this replica subscribed), since a purge deletes from L2 before it announces anything.
    """
    cache = state.cache
    l2 = cache.l2
    if l2 is None or not cache.l1.enabled:
        return
    keys = await record.top(top)
    now = state.clock()
    filled: dict[str, str] = {}
    for end in range(len(keys), 0, -FILL_BATCH):  # coldest batch first, so the hottest are set last
        batch = keys[max(0, end - FILL_BATCH) : end]
        generation = cache.l1.generation
        entries = await l2.get_many(batch)
        for key, entry in reversed(list(zip(batch, entries, strict=True))):
            if (
                entry is not None
                and entry.key == key
                and entry.age_s(now) <= entry.ttl_s
                and cache.backfill(entry, generation)
                and cache.l1.get(key) is entry
            ):
                filled[key] = entry.etag
    again = await read_batched(l2, list(filled))
    gone = [
        key for key, entry in zip(filled, again, strict=True) if entry is None or entry.etag != filled[key]
    ]
    if gone:
        cache.l1.delete(gone)
    warmup.filled = len(filled) - len(gone)


async def read_batched(l2: Tier, keys: list[str]) -> list[Entry | None]:
    entries: list[Entry | None] = []
    for start in range(0, len(keys), FILL_BATCH):
        entries += await l2.get_many(keys[start : start + FILL_BATCH])
    return entries


async def run_fill(state: MissState, record: HotRecord, warmup: Warmup) -> None:
    config = state.config.cache
    try:
        await asyncio.wait_for(
            fill_l1(state, record, config.warm_fill_top, warmup), config.warm_fill_timeout_s
        )
        warmup.outcome = "filled"
    except TimeoutError:
        warmup.outcome = "timeout"
    except FILL_FAILURES as exc:
        warmup.outcome = "error"
        log.warning("L1 warm-up from L2 stopped early: %s", exc)
    finally:
        warmup.done.set()
    log.info("L1 warm-up: %d hot entries from L2 (%s)", warmup.filled, warmup.outcome)


def settings_of(state: MissState) -> HotSettings:
    c = state.config.cache
    return HotSettings(
        max_keys=c.hot_record_max_keys,
        batch=c.hot_record_batch,
        flush_s=c.hot_record_flush_s,
        half_life_s=c.hot_record_half_life_s,
        max_request_bytes=c.hot_record_max_request_bytes,
        timeout_s=c.redis_timeout_s * 4,
    )


async def warm_ctx(state: MissState) -> AsyncIterator[None]:
    """One cleanup_ctx: the hot-key record (client, flusher) and the start-up L1 fill, with a Redis L2 only."""
    config = state.config.cache
    if config.l2_kind != "redis" or not config.hot_record_enabled:
        yield
        return
    client = command_client(config.redis_url, timeout_s=config.redis_timeout_s)
    flushes = Counter(
        "tokenedge_hot_record_flushes",
        "Hot-key record flushes to Redis",
        ["outcome"],
        registry=state.metrics.registry,
    )
    record = HotRecord(client, settings_of(state), state.clock, flushes)
    state.hot_record = record
    tasks = [asyncio.ensure_future(record.run())]
    if config.warm_fill_top > 0:
        warmup = Warmup()
        state.warmup = warmup
        tasks.append(asyncio.ensure_future(run_fill(state, record, warmup)))
    try:
        yield
    finally:
        state.hot_record = None
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await record.flush()  # what this replica counted since the last flush
        await client.aclose()
