"""Who is asking, for the handlers: the scope secret (`tenancy_ctx`; the scope itself is `gateway.hits.scope`)
and access to operator endpoints.

Operator endpoints: "direct loopback" is a loopback socket peer AND none of the forwarding headers any proxy or
CDN adds; a proxy on the same host makes every client look local, so such requests need the admin token.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import AsyncIterator, Mapping
from typing import Final

from aiohttp import web

from gateway.config.sections import ServerConfig
from gateway.hits.needs import HitState
from gateway.hits.secret import load_scope_secret
from gateway.hits.tenancy import Tenancy
from gateway.web.errors import NotFound, Unauthorized

FORWARDING_HEADERS: Final = frozenset(
    {"forwarded", "via", "x-real-ip", "true-client-ip", "cf-connecting-ip", "fastly-client-ip", "x-client-ip"}
)
FORWARDING_PREFIX: Final = "x-forwarded-"


async def tenancy_ctx(state: HitState) -> AsyncIterator[None]:
    """cleanup_ctx: resolve the deployment secret once at startup (config, Redis SET NX, or the state file)."""
    secret = await load_scope_secret(state.config)
    state.tenancy = Tenancy.from_config(state.config.server, secret)
    yield


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require_admin(headers: Mapping[str, str], admin_token: str) -> None:
    """Admin endpoints are disabled (404) without a configured token, never open; a wrong token is a 401."""
    if not admin_token:
        raise NotFound("admin endpoints are disabled: no admin token is configured")
    if not is_admin(headers, admin_token):
        raise Unauthorized("a valid admin bearer token is required")


def is_admin(headers: Mapping[str, str], admin_token: str, offered: str | None = None) -> bool:
    token = bearer_token(headers) or offered
    return (
        bool(admin_token) and token is not None and hmac.compare_digest(token.encode(), admin_token.encode())
    )


def is_forwarded(headers: Mapping[str, str]) -> bool:
    """Any header a proxy or CDN adds when it relays a request (RFC 7239 `Forwarded`, `Via`, the X-* family)."""
    return any(
        name.lower() in FORWARDING_HEADERS or name.lower().startswith(FORWARDING_PREFIX) for name in headers
    )


def is_direct_loopback(request: web.Request) -> bool:
    """The socket peer is loopback and nothing says the request was relayed."""
    try:
        local = request.remote is not None and ipaddress.ip_address(request.remote).is_loopback
    except ValueError:
        return False
    return local and not is_forwarded(request.headers)


def require_operator(request: web.Request, server: ServerConfig, what: str) -> None:
    """Operator endpoints: open to direct loopback when `dashboard_public_on_loopback`, else the admin token
    (bearer, or `?token=` for the dashboard page's own fetches); 404 elsewhere when no token is configured."""
    if server.dashboard_public_on_loopback and is_direct_loopback(request):
        return
    if not server.admin_token:
        raise NotFound(f"{what} is served to direct loopback clients only: no admin token is configured")
    if not is_admin(request.headers, server.admin_token, request.query.get("token")):
        raise Unauthorized(f"{what} needs the admin token")
