"""Per-request decoding knobs, validated once: a bad value is a ValueError (an OpenAI-style 400), never an assert.

`temperature` below `GREEDY_BELOW` (0 included) is greedy: dividing fp32 logits by a tinier one overflows to
inf and NaN probabilities, which would fail the step of the whole batch. `top_k` 0 or -1 and `top_p` 1
disable those filters; `seed` pins this sequence's own generator, so the same seed gives the same tokens
whatever shares the batch. Stop strings are the server's business (it sees text); the engine stops on
`stop_token_ids` and EOS (unless `ignore_eos`).
"""

from __future__ import annotations

from dataclasses import dataclass

GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or positive, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW
