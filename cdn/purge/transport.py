"""The one HTTP seam of the purge clients: `Transport.send(request, timeout_s) -> HttpResponse`.

aiohttp errors are translated here, once, into the small tree below, so retry logic and the provider
clients never see an aiohttp exception:

    TransportError            the request did not produce an HTTP response
    ├── TransportTimeout      no complete response within the per-request timeout
    └── TransportConnectError refused, reset, DNS, TLS or protocol failure
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

__all__ = [
    "AiohttpTransport",
    "HttpRequest",
    "HttpResponse",
    "Transport",
    "TransportConnectError",
    "TransportError",
    "TransportTimeout",
]


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]  # names lower-cased
    body: bytes


class TransportError(Exception):
    """The request produced no HTTP response. Messages never carry request headers (credentials)."""


class TransportTimeout(TransportError):
    pass


class TransportConnectError(TransportError):
    pass


class Transport(Protocol):
    async def send(self, request: HttpRequest, timeout_s: float) -> HttpResponse: ...


class AiohttpTransport:
    """`Transport` over an injected `aiohttp.ClientSession` (owned and closed by the caller)."""

    __slots__ = ("_session",)

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    async def send(self, request: HttpRequest, timeout_s: float) -> HttpResponse:
        try:
            async with self._session.request(
                request.method,
                request.url,
                headers=dict(request.headers),
                data=request.body or None,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
            ) as resp:
                body = await resp.read()
                headers = {k.lower(): v for k, v in resp.headers.items()}
                return HttpResponse(status=resp.status, headers=headers, body=body)
        except TimeoutError:
            raise TransportTimeout(f"no response within {timeout_s:g}s") from None
        except asyncio.CancelledError:
            raise
        except aiohttp.ClientError as exc:
            raise TransportConnectError(f"{type(exc).__name__}: {exc}") from None
