"""Per-request decoding knobs, validated once: a bad value is a ValueError (an OpenAI-style 400), never an assert.

`temperature` below `GREEDY_BELOW` (0 included) is greedy: dividing fp32 logits by a tinier one overflows to
inf and NaN probabilities, which would fail the step of the whole batch. `top_k` 0 or -1 and `top_p` 1
disable those filters; `seed` pins this sequence's own generator, so the same seed gives the same tokens
whatever shares the batch. Stop strings are the server's business (it sees text); the engine stops on
`stop_token_ids` and EOS (unless `ignore_eos`).

The logit processors (penalties, `logit_bias`, `min_tokens`, a grammar) and `logprobs` act on one row's
logits from its own history only (backend/engine/logits_processor.py), so they keep a row's result
independent of the batch. A row that uses any of them needs the exact fp32 head and never speculates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.engine.grammar import CompiledGrammar

GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS
MAX_LOGPROBS = 20  # OpenAI's top_logprobs ceiling
LOGIT_BIAS_RANGE = (-100.0, 100.0)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    frequency_penalty: float = 0.0  # OpenAI: minus penalty x count of the token in the output so far
    presence_penalty: float = 0.0  # OpenAI: minus penalty once the token is in the output
    repetition_penalty: float = 1.0  # vLLM/HF: divide positive (multiply negative) logits of seen tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), ids sorted
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens were generated
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the k most likely
    grammar: CompiledGrammar | None = None  # constrained decoding (backend/engine/grammar.py)
    cache_salt: str = ""  # prefix-cache isolation (vLLM's field): blocks are reused only under the same salt

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or positive, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (-2.0 <= self.frequency_penalty <= 2.0 and -2.0 <= self.presence_penalty <= 2.0):
            raise ValueError("frequency_penalty and presence_penalty must be in [-2, 2]")
        if not 0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        low, high = LOGIT_BIAS_RANGE
        if any(not low <= bias <= high for _, bias in self.logit_bias):
            raise ValueError(f"logit_bias values must be in [{low}, {high}]")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def processes_logits(self) -> bool:
        """Whether a processor changes this row's logits before sampling."""
        return bool(
            self.frequency_penalty
            or self.presence_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
            or self.grammar is not None
        )

    @property
    def exact_logits(self) -> bool:
        """Whether the row needs every logit exact (the fp32 head), not only a greedy-exact argmax."""
        return not self.greedy or self.processes_logits or self.logprobs is not None

    @property
    def speculates(self) -> bool:
        """Prompt-lookup drafts are verified by argmax alone: only plain greedy rows may use them."""
        return not self.exact_logits
