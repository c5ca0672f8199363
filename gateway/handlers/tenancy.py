"""Who is asking: the tenant credential (bearer token or configured header) and the admin check."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from gateway.errors import NotFound, Unauthorized


def bearer_token(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def tenant_credential(headers: Mapping[str, str], tenant_header: str) -> str | None:
    """The value whose hash scopes a tenant's entries; never logged or stored."""
    if tenant_header:
        value = headers.get(tenant_header)
        return value if value else None
    return bearer_token(headers)


def require_admin(headers: Mapping[str, str], admin_token: str) -> None:
    """Admin endpoints are disabled (404) without a configured token, never open; a wrong token is a 401."""
    if not admin_token:
        raise NotFound("admin endpoints are disabled: no admin token is configured")
    token = bearer_token(headers)
    if token is None or not hmac.compare_digest(token.encode(), admin_token.encode()):
        raise Unauthorized("a valid admin bearer token is required")


def is_admin(headers: Mapping[str, str], admin_token: str) -> bool:
    token = bearer_token(headers)
    return bool(admin_token) and token is not None and hmac.compare_digest(token.encode(), admin_token.encode())
