"""The token planner: per-request token counts, the context and budget checks, and the transport choice.

`TokenPath.plan` runs only where the answer is not in the cache (a miss that goes upstream, or a bypass) and only
when the model's tokenizer is known; it raises ContextTooLong (400) or RateLimited (429) before the upstream is
contacted, and says whether the request may go as token ids over the binary transport. Built once per process at
startup (`gateway.tokens.path.tokens_ctx`); the per-request seam that uses it is `gateway.tokens.path.TokenUpstream`.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.config.settings import TokensConfig
from gateway.ops.metrics import GatewayMetrics
from gateway.tokens.cache import TokenCache
from gateway.tokens.encoder import ModelEncoder, Unrenderable
from gateway.tokens.limiter import TokenRateLimiter
from gateway.tokens.registry import TokenizerRegistry, TokenizerSpec, default_cache_dir
from gateway.tokens.remote import RemoteTokenizers
from gateway.tokens.transport import BINARY_ENDPOINTS, BINARY_FIELDS
from gateway.upstream.catalog import ModelCatalog, ModelInfo
from gateway.upstream.transport import UpstreamTransport
from gateway.web.errors import ContextTooLong, RateLimited

_UNSEEN: Any = object()
MAX_OPENAI_MODELS = 1024  # model names remembered (client-chosen: bounded)


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
        self._openai_specs: dict[str, Any] = {}  # model name -> its OpenAI encoding's spec, or None
        self.remote = (
            RemoteTokenizers(config, upstream, metrics, clock) if config.remote_tokenize else None
        )  # token-exact keys from a third-party engine's own tokenize routes, once verified

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
        elif self.config.openai_models:
            # The first use loads cl100k (~1 s): off the event loop, once per model name. A thread hop on every
            # request cost a streamed miss milliseconds of time to first token on a busy machine.
            spec = self._openai_specs.get(model, _UNSEEN)
            if spec is _UNSEEN:
                spec = await asyncio.to_thread(self.registry.for_openai_model, model)
                if len(self._openai_specs) >= MAX_OPENAI_MODELS:
                    self._openai_specs.clear()
                self._openai_specs[model] = spec
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


def load_phrases(path: str) -> tuple[str, ...]:
    if not path:
        return ()
    doc = orjson.loads(Path(path).read_bytes())
    if not isinstance(doc, list) or not all(isinstance(p, str) for p in doc):
        raise ValueError(f"{path}: tokens.phrases_file must hold a JSON array of strings")
    return tuple(doc)
