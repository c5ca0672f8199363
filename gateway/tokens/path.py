"""The token path's glue: per-request token counts, budgets and the transport choice for cache misses.

Counting happens only where the answer is not in the cache (a miss that fills, or a bypass) and only when the
model's tokenizer is known: a hit never tokenizes. Fills get a `TokenUpstream`, which counts lazily (`gateway.tokens.planner`) when the
single-flight leader actually goes upstream (coalesced followers are not charged), answers an over-long
prompt (400 `context_length_exceeded`) or an exhausted tenant budget (429 + Retry-After) itself without
contacting the upstream, and sends the request as token ids when the backend advertises the binary transport.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.tokens.needs import TokenState
from gateway.tokens.planner import Plan, TokenPath
from gateway.tokens.transport import BINARY_ENDPOINTS, BinaryCall
from gateway.upstream.http import UpstreamResponse
from gateway.upstream.transport import UpstreamTransport
from gateway.web.errors import GatewayError, error_body

__all__ = ["Plan", "TokenPath", "TokenUpstream", "check_bypass", "tokens_ctx", "upstream_for"]


class TokenUpstream:
    """The per-request upstream seam handed to a fill: counts on first use, then binary or JSON over `upstream`
    (the state's transport at the time of the request)."""

    def __init__(
        self,
        path: TokenPath,
        upstream: UpstreamTransport,
        endpoint: str,
        body: Mapping[str, Any],
        tenant: str,
    ) -> None:
        self._path = path
        self._upstream = upstream
        self._endpoint = endpoint
        self._body = body
        self._tenant = tenant

    @property
    def body(self) -> Mapping[str, Any]:
        """The parsed request body this seam forwards (the intake's own object, never mutated)."""
        return self._body

    def with_body(self, body: Mapping[str, Any]) -> TokenUpstream:
        """The same seam for another body of the same request (the tee's usage ask, `gateway.misses.streaming.usage`)."""
        return TokenUpstream(self._path, self._upstream, self._endpoint, body, self._tenant)

    async def _plan(self, headers: Mapping[str, str]) -> Plan | UpstreamResponse:
        try:
            return await self._path.plan(self._endpoint, self._body, headers, self._tenant)
        except GatewayError as exc:  # answered here: the upstream is never contacted
            return UpstreamResponse(
                exc.status,
                CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json", **exc.headers})),
                error_body(exc.message, type_=exc.type, code=exc.code, param=exc.param),
            )

    def _binary(self, plan: Plan) -> BinaryCall | None:
        if not plan.binary or plan.ids is None or plan.encoder is None:
            return None
        return BinaryCall(self._upstream, self._endpoint, self._body, plan.ids, plan.encoder.version)

    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> UpstreamResponse:
        plan = await self._plan(headers)
        if isinstance(plan, UpstreamResponse):
            return plan
        call = self._binary(plan)
        if call is not None:
            resp = await call.request(headers)
            if resp is not None:
                return resp
        return await self._upstream.request(method, path_qs, headers, body)

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[Any]:
        plan = await self._plan(headers)
        if isinstance(plan, UpstreamResponse):
            yield _Local(plan)
            return
        call = self._binary(plan)
        if call is not None:
            async with call.open_stream(headers) as resp:
                if resp is not None:
                    yield resp
                    return
        async with self._upstream.open_stream(method, path_qs, headers, body) as resp:
            yield resp


class _Local:
    """A locally produced answer (400/429) in the shape the stream tee reads."""

    def __init__(self, resp: UpstreamResponse) -> None:
        self.status, self.headers, self._body = resp.status, resp.headers, resp.body

    async def read(self) -> bytes:
        return self._body


async def tokens_ctx(state: TokenState) -> AsyncIterator[None]:
    """cleanup_ctx: the token path, built once at startup after the cache ctx (it needs the upstream and catalog)."""
    if state.config.tokens.enabled:
        state.tokens = TokenPath(
            state.config.tokens, state.upstream, state.catalog, state.metrics, state.clock
        )
    try:
        yield
    finally:
        state.tokens = None


def upstream_for(
    state: TokenState, endpoint: str, body: Mapping[str, Any], tenant: str
) -> TokenUpstream | None:
    """The seam for a fill (None: the plain upstream); nothing is counted until the fill goes upstream."""
    path = state.tokens
    if path is None or endpoint not in BINARY_ENDPOINTS:
        return None
    return TokenUpstream(path, state.upstream, endpoint, body, tenant)


async def check_bypass(
    state: TokenState,
    endpoint: str,
    body: Mapping[str, Any],
    tenant: str,
    upstream_headers: Mapping[str, str],
) -> None:
    """Budgets for a bypassed request (relayed as JSON): raises ContextTooLong or RateLimited."""
    path = state.tokens
    if path is not None:
        await path.plan(endpoint, body, upstream_headers, tenant)
