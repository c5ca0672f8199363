"""Leases around the two fill paths: the JSON fill (`gateway.misses.fill`) and the stream tee (`gateway.misses.tee`).

Both run once per local flight, so only a flight's leader ever asks Redis for the lease (gateway/misses/lease.py); the
lease client is built at startup by `lease_ctx` (`MissState.leases`). Without leases (no Redis L2,
`cache.lease_enabled = false`, or a Redis error) they are the plain fill and tee.

Streams (`cache.lease_streams`): a replica that finds the lease held waits for the holder's stored entry and replays
it as SSE to its own subscribers. Trade-off: those clients see their first token only when the holder's whole
generation is stored (time to first token becomes the full generation time) in exchange for no second upstream
generation. With `lease_streams = false` streamed misses skip the lease: each replica streams from the upstream
(one call per replica, first tokens at upstream speed) while JSON misses still coalesce across replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import Counter

from gateway.hits.verdict import unfit
from gateway.keys.entry import Entry
from gateway.keys.policy import USAGE_ENDPOINTS, Outcome
from gateway.misses.answer import FillRequest
from gateway.misses.fill import FillResult, fill
from gateway.misses.lease import Lease, Leases, LeaseSettings
from gateway.misses.needs import MissState
from gateway.misses.streaming.broadcast import Frame, Head, StreamFlight
from gateway.misses.streaming.replay import replay_frames
from gateway.misses.tee import tee
from gateway.misses.warm import count_store
from gateway.ops import tracing
from gateway.tiers.redis_cluster import command_client, subscriber_clients
from gateway.upstream.http import UpstreamResponse

log = logging.getLogger("tokenedge.lease")


def _leases(state: MissState) -> Leases | None:
    """The lease client, unless there is none or the L2 breaker is open (then Redis is skipped, leases too)."""
    leases = state.leases
    l2 = state.cache.l2
    return leases if leases is not None and l2 is not None and l2.available else None


def _reader(state: MissState, key: str):
    async def read() -> Entry | None:
        """L2 only (the lookup already missed L1), uncounted in cache_lookups: lease reads are not lookups. P3, P4:
        back-filled under L1's generation, and a read a purge raced is None (the waiter reads or fills again)."""
        return await state.cache.fetch(key)

    return read


def _shared_response(entry: Entry) -> UpstreamResponse:
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})
    return UpstreamResponse(200, CIMultiDictProxy(headers), entry.body)


async def leased_fill(state: MissState, req: FillRequest) -> FillResult:
    """`fill`, or the entry another replica stored under its lease (marked `collapsed`)."""
    result = await _leased_fill(state, req)
    if result.entry is not None and not result.collapsed:
        count_store(state, req)  # the hot-key record keeps what filled the key (gateway/tiers/hotrecord.py)
    return result


async def _leased_fill(state: MissState, req: FillRequest) -> FillResult:
    leases = _leases(state)
    if leases is None:
        return await fill(state, req)
    with tracing.lease_wait():
        got = await leases.acquire_or_wait(req.key.key, _reader(state, req.key.key))
    if isinstance(got, Entry):
        if unfit(got, needs_usage=req.endpoint in USAGE_ENDPOINTS, needs_json=True) is None:
            return FillResult(_shared_response(got), got, None, collapsed=True)
        got = None  # another replica's entry with no JSON form or no usage (a plain stream's): fill
    if got is None:
        return await fill(state, req)
    stored = False
    try:
        result = await fill(state, req)
        stored = result.entry is not None
        return result
    finally:
        await got.release(stored=stored)


async def leased_tee(state: MissState, flight: StreamFlight, req: FillRequest) -> None:
    """`tee`, or another replica's stored entry replayed into the flight (`cache.lease_streams`)."""
    await _leased_tee(state, flight, req)
    if flight.outcome == Outcome.STORED:
        count_store(state, req)


async def _leased_tee(state: MissState, flight: StreamFlight, req: FillRequest) -> None:
    leases = _leases(state)
    if leases is None or not state.config.cache.lease_streams:
        await tee(state, flight, req)
        return
    try:
        with tracing.lease_wait():
            got: Entry | Lease | None = await leases.acquire_or_wait(req.key.key, _reader(state, req.key.key))
    except (
        Exception
    ):  # a lease bug must not leave the flight's subscribers waiting for a head: stream unleased
        log.exception("lease acquisition failed for %s; streaming without a lease", req.key.key)
        got = None
    if isinstance(got, Entry):
        _replay_into(state, flight, got)
        return
    if got is None:
        await tee(state, flight, req)
        return
    try:
        await tee(state, flight, req)
    finally:
        await got.release(stored=flight.outcome == Outcome.STORED)


def _replay_into(state: MissState, flight: StreamFlight, entry: Entry) -> None:
    """The whole entry as the flight's frames: subscribers that did not ask for usage skip the usage frame."""
    chunk_chars = state.config.stream.replay_chunk_chars
    with_usage = replay_frames(entry, include_usage=True, chunk_chars=chunk_chars)
    plain = set(replay_frames(entry, include_usage=False, chunk_chars=chunk_chars))
    flight.set_head(Head(200, CIMultiDictProxy(CIMultiDict({"Content-Type": "text/event-stream"}))))
    cap = state.config.cache.max_entry_bytes * 2
    for frame in with_usage[:-1]:
        flight.publish(Frame(frame, usage_only=frame not in plain), cap_bytes=cap)
    flight.finish(with_usage[-1], Outcome.LEASE_REPLAY)


async def lease_ctx(state: MissState) -> AsyncIterator[None]:
    """One cleanup_ctx: the lease client and its subscription, when Redis is the L2 and leases are on."""
    config = state.config.cache
    if config.l2_kind != "redis" or not config.lease_enabled:
        yield
        return
    url, timeout_s = config.redis_url, config.redis_timeout_s
    client = command_client(url, timeout_s=timeout_s)
    subscribers = subscriber_clients(url, timeout_s=timeout_s)
    counter = Counter(
        "tokenedge_lease",
        "Cross-replica lease outcomes on L2 misses",
        ["outcome"],
        registry=state.metrics.registry,
    )
    leases = Leases(
        client,
        LeaseSettings(
            ttl_s=config.lease_ttl_s, max_wait_s=config.lease_max_wait_s, timeout_s=config.redis_timeout_s * 4
        ),
        counter,
        state.clock,
    )
    listener = asyncio.ensure_future(leases.listen(subscribers))
    state.leases = leases
    try:
        yield
    finally:
        state.leases = None
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await client.aclose()
        for subscriber in subscribers:
            await subscriber.aclose()
