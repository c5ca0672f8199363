"""Whether an entry answers a request now: one pure decision for every way of serving a hit (design §4).

No I/O and no request objects: the entry, the time, the request's cache directives, the model revision the catalog
knows now and the conditional header. A purged entry never reaches here (the tiers drop it, and an L2 read that
raced a purge is discarded by its generation, `TieredCache.settle`).
"""

from __future__ import annotations

from enum import Enum

from gateway.keys.cache_control import NO_DIRECTIVES, RequestDirectives
from gateway.keys.entry import Entry
from gateway.keys.policy import Freshness, Reason, freshness, lacks, satisfies


class Verdict(Enum):
    HIT = "hit"  # fresh and acceptable to this request: serve it
    STALE = "stale"  # past its TTL, inside stale-if-error: kept aside in case the upstream fails
    MISS = "miss"  # nothing usable for this request


class Condition(Enum):
    NONE = "none"  # no conditional header, or it does not match: answer in full
    NOT_MODIFIED = "304"  # GET/HEAD with a matching If-None-Match
    PRECONDITION_FAILED = "412"  # any other method with a matching If-None-Match


def judge(
    entry: Entry,
    now: float,
    directives: RequestDirectives = NO_DIRECTIVES,
    revision: str | None = None,
    *,
    needs_usage: bool = False,
    needs_json: bool = True,
) -> Verdict:
    """The entry's verdict for a request with `directives`, when the model's current revision is `revision`
    (None: not known here; the key already names the revision it was derived for), the request's answer
    carries usage (`needs_usage`) and is JSON (`needs_json`; False for a stream)."""
    if revision is not None and entry.revision != revision:
        return Verdict.MISS  # an old revision's answer is never served once the new one is known
    if lacks(entry.usage, needs_usage=needs_usage, stream_only=entry.stream_only, needs_json=needs_json):
        return Verdict.MISS  # design §4: a hit is the whole answer; an entry missing what it needs is a miss
    age = entry.age_s(now)
    fresh = freshness(age_s=age, ttl_s=entry.ttl_s, stale_if_error_s=entry.stale_if_error_s)
    if fresh is Freshness.FRESH:
        # RFC 9111 §5.2.1.1 max-age / §5.2.1.3 min-fresh: a fresh entry the request refuses is not a hit,
        # and not a stale fallback either (it is fresh: the client asked for something younger).
        return Verdict.HIT if satisfies(age_s=age, directives=directives) else Verdict.MISS
    return Verdict.STALE if fresh is Freshness.STALE else Verdict.MISS


def unfit(entry: Entry, *, needs_usage: bool, needs_json: bool) -> Reason | None:
    """Why the entry cannot answer a request of this form (`policy.lacks`): no usage, or no JSON form."""
    return lacks(entry.usage, needs_usage=needs_usage, stream_only=entry.stream_only, needs_json=needs_json)


def etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 §13.1.2: weak comparison; `*` matches any current representation."""
    tags = [t.strip() for t in if_none_match.split(",")]
    return "*" in tags or etag in tags or f"W/{etag}" in tags


def condition(method: str, if_none_match: str | None, etag: str) -> Condition:
    """RFC 9110 §13.1.2: when If-None-Match matches the selected representation, GET and HEAD answer 304 Not
    Modified and every other method 412 Precondition Failed. On the POST routes the entry is the answer the
    request would get, so a client that already holds it (its ETag) is told so instead of paying for it again."""
    if not if_none_match or not etag_matches(if_none_match, etag):
        return Condition.NONE
    return Condition.NOT_MODIFIED if method in ("GET", "HEAD") else Condition.PRECONDITION_FAILED
