"""The cache read shared by the JSON and streamed paths: L1/L2 lookup, then the hit core's verdict (design §4).

A hit is an entry `hits.verdict.judge` accepts for this request now; an entry past its TTL but inside
stale-if-error is kept aside, to be served only if the upstream then fails. `no-cache` (lookup.read False) skips
the read entirely. A read the fast lane made and did not serve (`PRE_READ`) is used as it is: the tiers are read
and counted once per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.hits.needs import HitState
from gateway.hits.verdict import Verdict, judge, unfit
from gateway.keys.cache_control import RequestDirectives
from gateway.keys.entry import Entry
from gateway.keys.policy import Lookup, Reason
from gateway.ops import tracing
from gateway.ops.timing import lap
from gateway.tiers.tiered import Found

# A lookup the fast lane already made for this request's key and did not serve (a miss, a stale entry): the normal
# path uses it instead of reading (and counting) the tiers a second time. (key, what `TieredCache.get` returned).
PRE_READ: web.RequestKey[tuple[str, Found | None]] = web.RequestKey("tokenedge_pre_read", tuple)


@dataclass(frozen=True, slots=True)
class CacheRead:
    hit: Found | None  # a fresh, acceptable entry
    stale: Entry | None  # usable only if the upstream fails
    now: float
    lacking: Reason | None = None  # an entry of the current revision was found but cannot answer this request


async def read_cache(
    request: web.Request,
    state: HitState,
    key: str,
    lookup: Lookup,
    directives: RequestDirectives,
    revision: str | None = None,
    *,
    stream: bool = False,
) -> CacheRead:
    """The read and its verdict; `stream`: the request is streamed (a stream-only entry can answer it)."""
    if not lookup.read:
        return CacheRead(None, None, state.clock())
    read = request.pop(PRE_READ, None)
    deepest = "l2" if state.cache.l2 is not None else "l1"
    with tracing.span("tokenedge.cache.read") as span:
        found = read[1] if read is not None and read[0] == key else await state.cache.get(key)
        if span is not None:  # traced: the tiers read and what answered (`TieredCache.get` reads L1, then L2)
            span.set_attributes(tracing.read_attributes(found, deepest, pre_read=read is not None))
    lap(request, found.tier if found is not None else deepest)
    now = state.clock()  # after the (possibly remote) read: the age is the entry's age as served
    if found is None:
        return CacheRead(None, None, now)
    entry, needs_json = found.entry, not stream
    verdict = judge(entry, now, directives, revision, needs_usage=lookup.needs_usage, needs_json=needs_json)
    if verdict is Verdict.HIT:
        return CacheRead(found, None, now)
    lacking = None
    if verdict is Verdict.MISS and (revision is None or entry.revision == revision):
        lacking = unfit(entry, needs_usage=lookup.needs_usage, needs_json=needs_json)
        if lacking is not None:  # Cache-Status says why; the metric counts it
            state.metrics.unfit_misses.labels(entry.endpoint, lacking).inc()
    return CacheRead(None, entry if verdict is Verdict.STALE else None, now, lacking)
