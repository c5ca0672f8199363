"""One request's state in the engine: its tokens, where their KV lives, and how far it has been computed.

Invariants: `token_ids` = prompt + outputs, never a speculative draft (drafts travel on the scheduled step,
`ScheduledSeq.draft`, so block hashes cover real tokens only); the KV of the first `num_computed_tokens` tokens
is in the blocks of `block_table` (in order); a sequence that is not running holds no blocks.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Literal

import torch

from backend.engine.logprobs import TokenLogprobs
from backend.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from backend.engine.grammar import GrammarMatcher

FinishReason = Literal["stop", "length", "abort"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    __slots__ = (
        "admitted",
        "block_hashes",
        "block_table",
        "finish_reason",
        "generator",
        "matcher",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "params",
        "request_id",
        "status",
        "step_logprobs",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_ids: Seq[int],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> None:
        assert len(prompt_ids) > 0, "a sequence needs at least one prompt token"
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.generator = generator
        # the grammar position (backend/engine/grammar.py) when params.grammar is set, else None
        self.matcher: GrammarMatcher | None = None if params.grammar is None else params.grammar.new_matcher()
        self.step_logprobs: TokenLogprobs | None = (
            None  # set by the runner, taken by the engine's postprocess
        )
        self.block_table: list[int] = []
        # chained hashes of the leading full blocks, computed once (token content of full blocks never changes)
        self.block_hashes: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit at first admission (reported to the client)
        self.admitted = False
        self.num_preemptions = 0
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={len(self.block_table)}, {self.status.value})"
        )
