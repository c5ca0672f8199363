"""Sequence: prompt/output bookkeeping."""

from __future__ import annotations

from backend.engine.sampling import SamplingParams
from backend.engine.sequence import Sequence, SequenceStatus


def test_outputs_are_the_tokens_after_the_prompt() -> None:
    seq = Sequence("r", [5, 6, 7], SamplingParams())
    seq.token_ids += [8, 9]
    assert seq.num_prompt_tokens == 3 and seq.num_tokens == 5
    assert seq.output_token_ids == [8, 9] and seq.num_output_tokens == 2
    assert seq.status is SequenceStatus.WAITING and not seq.is_finished
    assert seq.block_table == [] and seq.num_computed_tokens == 0
