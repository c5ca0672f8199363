"""The caller's key scope (design §3), derived from the request being answered and nothing else.

`pub` on a public route; otherwise the keyed hash of the request's own credential headers (or a trusted proxy's
tenant header), `gateway.hits.tenancy`. Never read from a record another request can write (the request memo, a
connection): two callers sending the same body must get two scopes, however their requests interleave.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from aiohttp import web

from gateway.hits.needs import HitState
from gateway.hits.tenancy import Tenancy
from gateway.keys.derive import PUBLIC_SCOPE

_SCOPE_MEMO: Final = web.RequestKey("tokenedge_scope", tuple[str, bytes])
Credentials = tuple[
    tuple[bytes, bytes], ...
]  # (lower-case name, raw value) of each credential header, in order


def tenancy_of(state: HitState) -> Tenancy:
    tenancy = state.tenancy
    assert tenancy is not None, "tenancy_ctx runs after the cache ctx at startup"
    return tenancy


def scope_of(request: web.Request, state: HitState) -> str:
    """The caller's tenant scope (its credentials, or a trusted tenant header), computed once per request; raises
    Unauthorized where the configuration refuses the request."""
    return _classified(request, state)[0]


def wire_of(request: web.Request, state: HitState) -> bytes:
    """The key material of the request's headers and query string (gateway.keys.parts), b"" when none."""
    return _classified(request, state)[1]


def _classified(request: web.Request, state: HitState) -> tuple[str, bytes]:
    found = request.get(_SCOPE_MEMO)
    if found is None:
        found = request[_SCOPE_MEMO] = tenancy_of(state).classify(
            request.headers, request.remote, request.rel_url.raw_query_string
        )
    return found


def key_scope(request: web.Request, state: HitState, endpoint: str) -> str:
    """The scope of this request's cache key on `endpoint`: `pub` on a public route, else the caller's."""
    if state.config.routes[endpoint].scope == "public":
        return PUBLIC_SCOPE
    return scope_of(request, state)


def key_scope_of_fields(
    state: HitState, endpoint: str, credentials: Credentials, headers: Callable[[], Mapping[str, str]]
) -> str:
    """`key_scope` for a request the fast lane read itself (no aiohttp request): `pub` on a public route, else the
    caller's scope from its own credential headers, memoized by their raw values (the same raw values give the same
    `getall` values for every name, so the same scope). `headers` (the request's fields, decoded as aiohttp would)
    is asked only the first time these credentials are seen. Not for a trusted tenant header: the peer decides
    there, and the lane leaves such requests to the ordinary path."""
    if state.config.routes[endpoint].scope == "public":
        return PUBLIC_SCOPE
    tenancy = tenancy_of(state)
    assert not tenancy.tenant_header, "the fast lane is off with a trusted tenant header"
    return tenancy.scope_of_raw(credentials, lambda: tenancy.scope(headers(), None))
