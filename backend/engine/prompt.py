"""A prompt the engine may run, checked once where the request enters.

`PromptLimits.validate` holds the one set of rules: the prompt is not empty, leaves room for at least one new
token under `max_model_len`, and every id is a token of the vocabulary (not a placeholder for a byte the
vocabulary has no token for). The server calls it at the HTTP boundary (backend/server/prompts.py) and turns its
error into an OpenAI 400; direct users of the engine (tests, benchmarks) call `LLMEngine.prompt`. Everything
inside (AsyncEngine, LLMEngine.add_request, Sequence) takes a `ValidPrompt` and never checks again.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from backend.engine.errors import InvalidRequestError


class PromptProblem(enum.Enum):
    EMPTY = "empty"
    TOO_LONG = "too_long"  # the server's `context_length_exceeded`
    OUT_OF_VOCABULARY = "out_of_vocabulary"
    NOT_A_TOKEN = "not_a_token"  # a placeholder id: in range, but no token of this model


class InvalidPromptError(InvalidRequestError):
    def __init__(self, problem: PromptProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


@dataclass(frozen=True, slots=True)
class ValidPrompt:
    """Token ids that passed `PromptLimits.validate`; build one only through it."""

    ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class PromptLimits:
    vocab_size: int
    max_model_len: int
    not_tokens: frozenset[int] = frozenset()  # ids that stand for no token (the tokenizer's placeholders)

    def validate(self, ids: Sequence[int]) -> ValidPrompt:
        """The prompt as a ValidPrompt, or InvalidPromptError naming the first rule it breaks."""
        if not ids:
            raise InvalidPromptError(PromptProblem.EMPTY, "the prompt is empty")
        low, high = _bounds(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InvalidPromptError(
                PromptProblem.OUT_OF_VOCABULARY,
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size})",
            )
        prompt = tuple(ids.tolist() if isinstance(ids, array) else ids)
        if self.not_tokens and not self.not_tokens.isdisjoint(prompt):
            bad = min(self.not_tokens.intersection(prompt))
            raise InvalidPromptError(
                PromptProblem.NOT_A_TOKEN, f"token id {bad} is not a token of this model"
            )
        if len(prompt) >= self.max_model_len:
            raise InvalidPromptError(
                PromptProblem.TOO_LONG,
                f"the prompt has {len(prompt)} tokens; this model's maximum context length is "
                f"{self.max_model_len}",
            )
        return ValidPrompt(prompt)


def _bounds(ids: Sequence[int]) -> tuple[int, int]:
    """The smallest and largest id; an `array` (the binary transport's int32 body) is scanned by numpy, zero-copy."""
    if isinstance(ids, array):
        view = np.frombuffer(ids, dtype=ids.typecode)  # ids: [k]
        return int(view.min()), int(view.max())
    return min(ids), max(ids)
