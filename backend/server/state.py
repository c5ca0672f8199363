"""Typed application state: what the handlers share, under `web.AppKey`s."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from backend.engine.embedding import EmbeddingOut
from backend.engine.grammar import GrammarCompiler
from backend.engine.outputs import EngineStats
from backend.engine.prompt import PromptLimits, ValidPrompt
from backend.engine.sampling_params import SamplingParams
from backend.metrics import BackendMetrics
from backend.server.response_store import ResponseStore, StoreLimits
from backend.tokenizer import Tokenizer


class Engine(Protocol):
    """The slice of `AsyncEngine` the server uses (a fake can stand in for it in tests)."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def generate(
        self, prompt: ValidPrompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[Any]: ...
    def stats(self) -> EngineStats: ...
    async def embed(self, prompt: ValidPrompt, request_id: str) -> EmbeddingOut: ...


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    revision: str
    tokenizer: Tokenizer
    max_model_len: int
    created: int  # unix seconds, reported by /v1/models
    hidden_size: int | None = None  # the width of its embeddings (/v1/embeddings)
    runtime: Mapping[str, Any] = field(default_factory=dict)  # device, dtype, kernels (backend/runtime.py)
    batch_invariant: bool = True  # the engine's mode (EngineConfig.batch_invariant), reported by /v1/models

    @property
    def prompt_limits(self) -> PromptLimits:
        """What a prompt for this model must satisfy (checked once, by backend/server/prompts.py)."""
        tokenizer = self.tokenizer
        return PromptLimits(tokenizer.vocab_size, self.max_model_len, tokenizer._placeholders)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_n: int = 4
    default_max_tokens: int = 256
    retry_after_s: int = 1
    stored_responses: StoreLimits = field(default_factory=StoreLimits)  # POST /v1/responses `store`

    def __post_init__(self) -> None:
        if self.max_n < 1 or self.default_max_tokens < 1 or self.retry_after_s < 0:
            raise ValueError(f"invalid server limits: {self}")


EngineFactory = Callable[[], Engine]

MODEL_KEY = web.AppKey("model", ServedModel)
LIMITS_KEY = web.AppKey("limits", ServerLimits)
ENGINE_FACTORY_KEY: web.AppKey[EngineFactory] = web.AppKey("engine_factory")
ENGINE_KEY = web.AppKey("engine", Engine)
METRICS_KEY = web.AppKey("metrics", BackendMetrics)
RESPONSES_KEY = web.AppKey("responses", ResponseStore)  # stored responses, for previous_response_id
GRAMMARS_KEY = web.AppKey("grammars", GrammarCompiler)  # response_format grammars for the served vocabulary
