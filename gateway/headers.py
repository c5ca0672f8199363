"""Response caching headers: the CDN contract of DESIGN §5.

A hit and a stored miss carry the same validators and freshness so a CDN in front can cache and purge them;
only `Age` and `Cache-Status` vary per response. Tenant-scoped answers are `private` for generic shared caches;
CDN-Cache-Control (RFC 9213) and Surrogate-Control speak to the edge we configure, which keys on the tenant.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from aiohttp import web

from cdn.tags import tag_headers
from gateway.entry import Entry
from gateway.keys import PUBLIC_SCOPE
from gateway.upstream import relay_headers

CACHE_STATUS = "Cache-Status"
NAME = "tokenedge"


def entry_headers(entry: Entry, *, tag_targets: Sequence[str]) -> tuple[dict[str, str], int]:
    """The per-entry, time-independent headers (a fresh copy), plus how many tags were dropped to fit limits.

    Memoized by their inputs in one bounded table (not on the entry, whose L1 size must not grow after it is
    stored): a hit on a recently served entry pays for a dict copy, not for tag encoding.
    """
    headers, truncated = _header_block(
        entry.key, entry.etag, entry.ttl_s, entry.stale_if_error_s, entry.tags, tuple(tag_targets)
    )
    return dict(headers), truncated


@functools.lru_cache(maxsize=4096)
def _header_block(
    key: str,
    etag: str,
    ttl_s: int,
    stale_if_error_s: int,
    tags: tuple[str, ...],
    tag_targets: tuple[str, ...],
) -> tuple[dict[str, str], int]:
    """A pure function of its arguments (callers copy the dict), so memoizing it is safe across entries."""
    public = key.split(":", 2)[1] == PUBLIC_SCOPE
    edge = f"max-age={ttl_s}"
    if stale_if_error_s:
        edge += f", stale-if-error={stale_if_error_s}"
    headers = {
        "Content-Type": "application/json",
        "ETag": etag,
        # RFC 9111 §5.2.2.10: s-maxage governs shared caches; max-age=0 keeps browsers from reusing it unasked.
        "Cache-Control": f"public, max-age=0, s-maxage={ttl_s}" if public else "private",
        "CDN-Cache-Control": edge,
        "Surrogate-Control": edge,
        "X-Cache-Key": key,
        "Vary": "Authorization" if not public else "Accept-Encoding",
    }
    tag_values, truncated = tag_headers(tags, tag_targets)
    headers.update(tag_values)
    return headers, truncated


header_block = (
    _header_block  # the shared block by its inputs (gateway.fastpath encodes it; callers never mutate)
)


def hit_status(entry: Entry, now: float, *, tier: str) -> tuple[str, str]:
    """(Cache-Status, Age) for a fresh hit; RFC 9211 §2.4: ttl is the remaining freshness in seconds."""
    age = int(entry.age_s(now))
    return f"{NAME}; hit; ttl={entry.ttl_s - age}; detail={tier}", str(age)


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
