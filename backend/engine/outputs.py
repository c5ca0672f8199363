"""What the engine hands back: one TokenOut per generated token, and a stats snapshot for /metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from backend.engine.logprobs import TokenLogprobs

if TYPE_CHECKING:
    from backend.engine.embedding import EmbeddingOut


@dataclass(frozen=True, slots=True)
class TokenOut:
    """One generated token. On a "stop" finish, `token_id` is the stop/EOS token itself (not to be rendered)."""

    token_id: int
    finish_reason: Literal["stop", "length"] | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: TokenLogprobs | None = None  # when the request asked for them


@dataclass(frozen=True, slots=True)
class StepOutput:
    request_id: str
    token: TokenOut | EmbeddingOut  # EmbeddingOut: the one result of an embedding request


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int
    waiting: int
    blocks_total: int
    blocks_free: int  # allocatable now: empty plus cached-but-unused blocks
    blocks_cached: int  # blocks carrying a prefix hash, in use or free
    prefix_hit_tokens_total: int
    prefill_tokens_total: int
    generated_tokens_total: int
    spec_verify_steps_total: int = 0  # forwards that verified drafts
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    max_running: int = 0  # sequences it decodes at once (max_num_seqs); 0: not said
