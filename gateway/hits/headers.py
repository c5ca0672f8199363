"""Response caching headers: the CDN contract of design §5, for answers that are not hits.

Cache-Status for stale answers, misses and bypasses, and the headers of an upstream answer relayed unstored. An
answer served from an entry (hit, stale, stored miss) takes the entry's block from the hit core,
`gateway.hits.render`, so a CDN in front can cache and purge every one of them alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from multidict import CIMultiDict

from gateway.keys.entry import Entry
from gateway.upstream.http import relay_headers

CACHE_STATUS = "Cache-Status"
NAME = "tokenedge"


def stale_status(entry: Entry, now: float, reason: str) -> tuple[str, str]:
    age = int(entry.age_s(now))
    return f"{NAME}; hit; ttl={entry.ttl_s - age}; detail=stale-if-error-{reason}", str(age)


def miss_status(*, stored: bool, collapsed: bool = False, detail: str | None = None, level: str = "") -> str:
    """RFC 9211 §2.8 `detail` (one sf-token): why it was not stored, then the key's level, dot-joined
    (`detail=tokens`, `detail=status.exact`), so a miss always says which canonicalization level keyed it."""
    parts = [NAME, "fwd=miss"]
    if collapsed:
        parts.append("collapsed")  # RFC 9211 §2.6: the request was collapsed into another's forward
    if stored:
        parts.append("stored")
    words = list(dict.fromkeys(w for part in (detail, level) if part for w in part.split(".")))  # once each
    if words:
        parts.append(f"detail={'.'.join(words)}")
    return "; ".join(parts)


def bypass_status(reason: str) -> str:
    return f"{NAME}; fwd=bypass; detail={reason}"


BYPASS_CACHE_CONTROL = "no-store"
# What a coalesced follower may see of the leader's upstream answer when no entry was stored: what describes the body
# it is sent (RFC 9110 §8.4, §8.5) and when to ask again. Never the leader's account, quota counters or request ids
# (`openai-organization`, `x-ratelimit-*`, `x-request-id`): on a public route the follower is another caller.
FOLLOWER_RELAYED = frozenset({"content-encoding", "content-language", "retry-after"})


def relayed(upstream_headers: Mapping[str, str], *, collapsed: bool) -> CIMultiDict[str]:
    """The upstream fields relayed with a miss: the leader gets its own answer's, a follower only FOLLOWER_RELAYED."""
    headers = relay_headers(upstream_headers)
    if not collapsed:
        return headers
    return CIMultiDict((n, v) for n, v in headers.items() if n.lower() in FOLLOWER_RELAYED)


def unstored_response(
    status: int,
    upstream_headers: Mapping[str, str],
    body: bytes,
    *,
    collapsed: bool,
    detail: str | None,
    level: str = "",
) -> web.Response:
    """An upstream answer relayed with its own status and body, marked as not stored (JSON and stream paths)."""
    headers = relayed(upstream_headers, collapsed=collapsed)
    headers[CACHE_STATUS] = miss_status(stored=False, collapsed=collapsed, detail=detail, level=level)
    headers["Cache-Control"] = "no-store"
    # RFC 9213: an upstream's own CDN-Cache-Control would override no-store at a CDN.
    for edge in ("CDN-Cache-Control", "Surrogate-Control"):
        headers.popall(edge, None)
    if "Content-Type" in upstream_headers:
        headers["Content-Type"] = upstream_headers["Content-Type"]
    return web.Response(status=status, body=body, headers=headers)
