"""backend/engine/logits_processor.py: each processor's formula on a known row, from the row's own history."""

from __future__ import annotations

import math

import pytest
import torch

from backend.engine.logits_processor import process_logits, token_logprobs
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence

EOS = 0


def seq_with(params: SamplingParams, prompt: list[int], output: list[int]) -> Sequence:
    seq = Sequence("r", prompt, params)
    seq.token_ids.extend(output)
    return seq


def processed(params: SamplingParams, prompt: list[int], output: list[int], row: list[float]) -> list[float]:
    logits = torch.tensor([row])
    process_logits(logits, [seq_with(params, prompt, output)], frozenset({EOS}))
    return logits[0].tolist()


ROW = [1.0, 2.0, -1.0, 0.5, 3.0]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        # token 4 twice and token 3 once in the output; frequency: minus 0.5 per occurrence
        (SamplingParams(frequency_penalty=0.5), [1.0, 2.0, -1.0, 0.0, 2.0]),
        (SamplingParams(presence_penalty=0.5), [1.0, 2.0, -1.0, 0.0, 2.5]),
        # prompt token 2 (negative: multiplied) and output tokens 3, 4 (positive: divided)
        (SamplingParams(repetition_penalty=2.0), [1.0, 2.0, -2.0, 0.25, 1.5]),
        (SamplingParams(logit_bias=((1, -100.0), (2, 3.5))), [1.0, -98.0, 2.5, 0.5, 3.0]),
        (SamplingParams(min_tokens=4, max_tokens=8), [-math.inf, 2.0, -1.0, 0.5, 3.0]),
        (SamplingParams(min_tokens=3, max_tokens=8), ROW),  # three tokens generated: EOS allowed again
    ],
)
def test_each_processor_applies_its_formula(params: SamplingParams, expected: list[float]) -> None:
    assert processed(params, [2], [4, 3, 4], ROW) == expected


def test_rows_that_ask_for_nothing_are_untouched_and_rows_do_not_mix() -> None:
    logits = torch.tensor([ROW, ROW])
    seqs = [seq_with(SamplingParams(), [2], [4]), seq_with(SamplingParams(frequency_penalty=1.0), [2], [4])]
    process_logits(logits, seqs, frozenset({EOS}))
    assert logits[0].tolist() == ROW and logits[1].tolist() == [1.0, 2.0, -1.0, 0.5, 2.0]


def test_logprobs_are_the_log_softmax_with_the_top_sorted_and_masked_tokens_left_out() -> None:
    row = torch.tensor([0.0, 2.0, -math.inf, 1.0])
    out = token_logprobs(row, 3, top=4)
    expected = torch.log_softmax(row, dim=-1)
    assert out.logprob == pytest.approx(float(expected[3]))
    assert [i for i, _ in out.top] == [1, 3, 0]
    assert [lp for _, lp in out.top] == sorted((lp for _, lp in out.top), reverse=True)
