"""PromptLimits.validate, the one set of prompt rules: each broken rule named, an int32 array judged like a list."""

from __future__ import annotations

from array import array

import pytest

from backend.engine.errors import InvalidRequestError
from backend.engine.prompt import InvalidPromptError, PromptLimits, PromptProblem, ValidPrompt

LIMITS = PromptLimits(vocab_size=100, max_model_len=8, not_tokens=frozenset({99}))


@pytest.mark.parametrize(
    "ids, problem",
    [
        ([], PromptProblem.EMPTY),
        ([1, -1], PromptProblem.OUT_OF_VOCABULARY),
        ([1, 100], PromptProblem.OUT_OF_VOCABULARY),
        ([2**70], PromptProblem.OUT_OF_VOCABULARY),
        ([5, 99], PromptProblem.NOT_A_TOKEN),
        ([1] * 8, PromptProblem.TOO_LONG),  # no room left for one new token
        ([1, 100] * 8, PromptProblem.OUT_OF_VOCABULARY),  # the ids are judged before the length
    ],
)
def test_each_broken_rule_is_named(ids: list[int], problem: PromptProblem) -> None:
    with pytest.raises(InvalidPromptError) as caught:
        LIMITS.validate(ids)
    assert caught.value.problem is problem
    assert isinstance(caught.value, InvalidRequestError)  # the engine's 400 family


@pytest.mark.parametrize("ids", [[0], [98] * 7, [0, 1, 2, 3]])
def test_a_good_prompt_comes_back_as_its_ids(ids: list[int]) -> None:
    assert LIMITS.validate(ids) == ValidPrompt(tuple(ids))


@pytest.mark.parametrize("ids", [[3, 4], [3, -4], [3, 100], [3, 99], [1] * 8])
def test_an_int32_array_is_judged_like_a_list(ids: list[int]) -> None:
    def outcome(value: list[int] | array[int]) -> ValidPrompt | PromptProblem:
        try:
            return LIMITS.validate(value)
        except InvalidPromptError as exc:
            return exc.problem

    assert outcome(array("i", ids)) == outcome(ids)
