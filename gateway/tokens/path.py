"""The token path's glue: per-request token counts, budgets and the transport choice for cache misses.

Counting happens only where the answer is not in the cache (a miss that fills, or a bypass) and only when the
model's tokenizer is known: a hit never tokenizes. Fills get a `TokenUpstream`, which counts lazily when the
single-flight leader actually goes upstream (coalesced followers are not charged), answers an over-long
prompt (400 `context_length_exceeded`) or an exhausted tenant budget (429 + Retry-After) itself without
contacting the upstream, and sends the request as token ids when the backend advertises the binary transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.catalog import ModelCatalog, ModelInfo
from gateway.config import TokensConfig
from gateway.errors import ContextTooLong, GatewayError, RateLimited, error_body
from gateway.metrics import GatewayMetrics
from gateway.state import GatewayState
from gateway.tokens.cache import TokenCache
from gateway.tokens.encoder import ModelEncoder, Unrenderable
from gateway.tokens.limiter import TokenRateLimiter
from gateway.tokens.registry import TokenizerRegistry, TokenizerSpec, default_cache_dir
from gateway.tokens.transport import BINARY_ENDPOINTS, BINARY_FIELDS, BinaryCall
from gateway.transport import UpstreamTransport
from gateway.upstream import UpstreamResponse

log = logging.getLogger("tokenedge.tokens")
TOKEN_PATH = "tokens"  # GatewayState.extensions key


@dataclass(frozen=True, slots=True)
class Plan:
    count: int | None = None  # prompt tokens; None: not counted (tokenizer unknown or not renderable)
    ids: array[int] | None = None  # exact model ids, when the tokenizer is the backend's own
    encoder: ModelEncoder | None = None
    binary: bool = False


def _max_tokens(body: Mapping[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class TokenPath:
    def __init__(
        self,
        config: TokensConfig,
        upstream: UpstreamTransport,
        catalog: ModelCatalog,
        metrics: GatewayMetrics,
        clock: Any,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = metrics
        self.cache = TokenCache(config.cache_max_bytes)
        self.registry = TokenizerRegistry(
            upstream,
            cache_dir=Path(config.cache_dir) if config.cache_dir else default_cache_dir(),
            clock=clock,
        )
        self.phrases: tuple[str, ...] = load_phrases(config.phrases_file)
        self.limiter = (
            TokenRateLimiter(config.tokens_per_minute, burst_tokens=config.burst_tokens, clock=clock)
            if config.tokens_per_minute > 0
            else None
        )
        self._encoders: dict[str, ModelEncoder] = {}

    def encoder(self, spec: TokenizerSpec) -> ModelEncoder:
        enc = self._encoders.get(spec.version)
        if enc is None:
            enc = self._encoders[spec.version] = ModelEncoder(spec, self.cache, self.phrases)
        return enc

    async def encoder_for(
        self, model: str, info: ModelInfo | None, headers: Mapping[str, str]
    ) -> ModelEncoder | None:
        if info is not None and info.tokenizer:
            spec = self.registry.known(info.tokenizer) or await self.registry.backend(info.tokenizer, headers)
        elif self.config.openai_models:  # the first use loads cl100k (~1 s): off the event loop
            spec = await asyncio.to_thread(self.registry.for_openai_model, model)
        else:
            spec = None
        return None if spec is None else self.encoder(spec)

    async def plan(
        self, endpoint: str, body: Mapping[str, Any], headers: Mapping[str, str], tenant: str
    ) -> Plan:
        """Count the prompt and enforce the budgets (`tenant`: the request's scope); raises ContextTooLong or
        RateLimited."""
        model = body.get("model")
        if endpoint not in BINARY_ENDPOINTS or not isinstance(model, str):
            return Plan()
        info = self.catalog.known.get(model)
        encoder = await self.encoder_for(model, info, headers)
        if encoder is None:
            return Plan()
        started = time.perf_counter()
        try:
            count, ids = self._count(endpoint, body, encoder)
        except Unrenderable:
            return Plan(encoder=encoder)
        finally:
            self.metrics.tokenize_duration.observe(time.perf_counter() - started)
        wanted = _max_tokens(body)
        limit = info.max_model_len if info is not None else None
        if limit is not None and count >= limit:
            raise ContextTooLong(
                f"This model's maximum context length is {limit} tokens; the prompt has {count} "
                f"tokens. Shorten the prompt.",
                param="messages" if endpoint == "chat/completions" else "prompt",
            )
        if limit is not None and wanted and count + wanted > limit:
            raise ContextTooLong(
                f"This model's maximum context length is {limit} tokens; the prompt has {count} "
                f"tokens and max_tokens asks for {wanted} more.",
                param="max_tokens",
            )
        if self.limiter is not None:
            admission = self.limiter.admit(tenant, count + wanted)
            if not admission.allowed:
                raise RateLimited(
                    f"token rate limit reached: this request needs {count + wanted} tokens, "
                    f"{admission.remaining} are left this minute",
                    headers={"Retry-After": str(admission.retry_after_s)},
                )
        binary = (
            ids is not None
            and self.config.binary_transport
            and info is not None
            and "binary" in info.transports
            and BINARY_FIELDS.issuperset(body)
        )
        return Plan(count, ids, encoder, binary)

    def _count(
        self, endpoint: str, body: Mapping[str, Any], encoder: ModelEncoder
    ) -> tuple[int, array[int] | None]:
        exact = encoder.spec.source == "backend"
        if endpoint == "chat/completions":
            if exact:
                ids = encoder.encode_chat(body.get("messages") or [])
                return len(ids), ids
            return encoder.count_chat_estimate(body.get("messages")), None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = encoder.encode(prompt)
            return len(ids), ids if exact else None
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt), None
        raise Unrenderable("prompt shape not counted")


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


def load_phrases(path: str) -> tuple[str, ...]:
    if not path:
        return ()
    doc = orjson.loads(Path(path).read_bytes())
    if not isinstance(doc, list) or not all(isinstance(p, str) for p in doc):
        raise ValueError(f"{path}: tokens.phrases_file must hold a JSON array of strings")
    return tuple(doc)


def token_path(state: GatewayState) -> TokenPath | None:
    """The process's token path, built on first use (None when `[tokens] enabled = false`)."""
    path = state.extensions.get(TOKEN_PATH)
    if path is None:
        if not state.config.tokens.enabled:
            return None
        path = state.extensions[TOKEN_PATH] = TokenPath(
            state.config.tokens, state.upstream, state.catalog, state.metrics, state.clock
        )
    assert isinstance(path, TokenPath)
    return path


def upstream_for(
    state: GatewayState, endpoint: str, body: Mapping[str, Any], tenant: str
) -> TokenUpstream | None:
    """The seam for a fill (None: the plain upstream); nothing is counted until the fill goes upstream."""
    path = token_path(state)
    if path is None or endpoint not in BINARY_ENDPOINTS:
        return None
    return TokenUpstream(path, state.upstream, endpoint, body, tenant)


async def check_bypass(
    state: GatewayState,
    endpoint: str,
    body: Mapping[str, Any],
    tenant: str,
    upstream_headers: Mapping[str, str],
) -> None:
    """Budgets for a bypassed request (relayed as JSON): raises ContextTooLong or RateLimited."""
    path = token_path(state)
    if path is not None:
        await path.plan(endpoint, body, upstream_headers, tenant)
