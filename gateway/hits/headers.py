"""Response caching headers: the CDN contract of DESIGN §5, for answers that are not hits.

Cache-Status for stale answers, misses and bypasses, and the headers of an upstream answer relayed unstored. An
answer served from an entry (hit, stale, stored miss) takes the entry's block from the hit core,
`gateway.hits.render`, so a CDN in front can cache and purge every one of them alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

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
    words = [word for word in (detail, level) if word]
    if words:
        parts.append(f"detail={'.'.join(words)}")
    return "; ".join(parts)


def bypass_status(reason: str) -> str:
    return f"{NAME}; fwd=bypass; detail={reason}"


BYPASS_CACHE_CONTROL = "no-store"


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
    headers = relay_headers(upstream_headers)
    headers[CACHE_STATUS] = miss_status(stored=False, collapsed=collapsed, detail=detail, level=level)
    headers["Cache-Control"] = "no-store"
    if "Content-Type" in upstream_headers:
        headers["Content-Type"] = upstream_headers["Content-Type"]
    return web.Response(status=status, body=body, headers=headers)
