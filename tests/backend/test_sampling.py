"""Sampling: greedy, top-k/top-p filtering, temperature, per-sequence seeded generators, parameter checks."""

from __future__ import annotations

import pytest
import torch

from backend.engine.sampling import SamplingParams, make_generator, sample

LOGITS = torch.tensor([[0.0, 3.0, 2.5, -1.0, 1.0], [5.0, 0.0, 0.0, 0.0, 4.9]])


def draws(params: SamplingParams, row: int, n: int = 400) -> set[int]:
    gen = make_generator(params, "cpu")
    return {sample(LOGITS[row : row + 1], [params], [gen])[0] for _ in range(n)}


def test_greedy_takes_the_argmax_per_row() -> None:
    greedy = SamplingParams(temperature=0)
    assert sample(LOGITS, [greedy, greedy], [None, None]) == [1, 0]
    assert make_generator(greedy, "cpu") is None


def test_a_vanishing_temperature_is_greedy_not_nan() -> None:
    tiny = SamplingParams(temperature=1e-300, seed=0)  # logits / tiny overflow fp32: NaN probabilities
    assert make_generator(tiny, "cpu") is None
    assert sample(LOGITS, [tiny, tiny], [None, None]) == [1, 0]


def test_top_k_limits_the_candidates() -> None:
    assert draws(SamplingParams(top_k=2, seed=0), row=0) == {1, 2}
    assert draws(SamplingParams(top_k=1, seed=0), row=0) == {1}


def test_top_p_keeps_the_smallest_set_covering_p() -> None:
    # row 1: p(0) ~ 0.52, p(4) ~ 0.47, the rest ~ 0.01 together
    assert draws(SamplingParams(top_p=0.5, seed=0), row=1) == {0}
    assert draws(SamplingParams(top_p=0.9, seed=0), row=1) == {0, 4}


def test_temperature_sharpens_and_flattens() -> None:
    assert draws(SamplingParams(temperature=0.05, seed=0), row=0) == {1}
    assert len(draws(SamplingParams(temperature=5.0, seed=0), row=0)) == 5


def test_same_seed_same_draws_whatever_the_other_rows() -> None:
    seeded = SamplingParams(seed=42)
    alone_gen = make_generator(seeded, "cpu")
    alone = [sample(LOGITS[:1], [seeded], [alone_gen])[0] for _ in range(30)]
    other = SamplingParams(seed=7)
    gens = [make_generator(other, "cpu"), make_generator(seeded, "cpu")]
    batched = [sample(LOGITS[[1, 0]], [other, seeded], gens)[1] for _ in range(30)]
    assert batched == alone
    assert len(set(alone)) > 1


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}, {"max_tokens": 0}]
)
def test_invalid_parameters_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
