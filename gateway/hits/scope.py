"""The caller's key scope (DESIGN §3), derived from the request being answered and nothing else.

`pub` on a public route; otherwise the keyed hash of the request's own credential headers (or a trusted proxy's
tenant header), `gateway.tenancy`. Never read from a record another request can write (the request memo, a
connection): two callers sending the same body must get two scopes, however their requests interleave.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from gateway.keys import PUBLIC_SCOPE
from gateway.state import STATE, GatewayState
from gateway.tenancy import Tenancy

_SCOPE_MEMO: Final = web.RequestKey("tokenedge_scope", str)
Credentials = tuple[
    tuple[bytes, bytes], ...
]  # (lower-case name, raw value) of each credential header, in order


def tenancy_of(state: GatewayState) -> Tenancy:
    tenancy = state.tenancy
    assert tenancy is not None, "tenancy_ctx runs after the cache ctx at startup"
    return tenancy


def scope_of(request: web.Request) -> str:
    """The caller's tenant scope (its credentials, or a trusted tenant header), computed once per request; raises
    Unauthorized where the configuration refuses the request."""
    scope = request.get(_SCOPE_MEMO)
    if scope is None:
        scope = request[_SCOPE_MEMO] = tenancy_of(request.app[STATE]).scope(request.headers, request.remote)
    return scope


def key_scope(request: web.Request, state: GatewayState, endpoint: str) -> str:
    """The scope of this request's cache key on `endpoint`: `pub` on a public route, else the caller's."""
    if state.config.routes[endpoint].scope == "public":
        return PUBLIC_SCOPE
    return scope_of(request)


def key_scope_of_raw(
    request: web.Request, state: GatewayState, endpoint: str, credentials: Credentials
) -> str:
    """`key_scope` for the fast lane, memoized by the raw credential header values this request carries: the same
    raw values give the same `getall` values for every name, so the same scope. With a trusted tenant header the
    peer decides, so there is no raw-value memo."""
    if state.config.routes[endpoint].scope == "public":
        return PUBLIC_SCOPE
    tenancy = tenancy_of(state)
    if tenancy.tenant_header:
        return scope_of(request)
    return tenancy.scope_of_raw(credentials, lambda: scope_of(request))
