"""A generated token's log-probability and its best alternatives: a plain record the sequence, the logit
processors and the outputs share (its own module, so none of them imports another for it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A generated token's log-probability and the most likely alternatives at its position (descending)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
