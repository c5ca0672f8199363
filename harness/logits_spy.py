"""A spy on an engine's sampled logits and the check that each equals the model's full-recompute reference: the
paged-equivalence oracle, shared by the backend tests and the GPU check (harness/gpu/check.py)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from backend.engine.llm_engine import LLMEngine
from backend.engine.scheduler import ScheduledSeq
from backend.engine.sequence import Sequence
from backend.model.llama import LlamaModel

ATOL = 1e-4


class LogitsSpy:
    """Wraps the runner to keep every sampled row: (sequence, its token count at that step, logits)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.rows: list[tuple[Sequence, int, torch.Tensor]] = []
        self.max_ref_count = 0
        self._engine = engine
        self._inner = engine.runner.compute_logits
        engine.runner.compute_logits = self._compute  # type: ignore[method-assign]

    def _compute(self, batch: Seq[ScheduledSeq]) -> torch.Tensor:
        pool = self._engine.pool
        self.max_ref_count = max(
            [self.max_ref_count] + [pool.ref_count(b) for item in batch for b in item.seq.block_table]
        )
        logits = self._inner(batch)
        sampled = [item.seq for item in batch if item.samples]
        self.rows.extend((seq, seq.num_tokens, row.clone()) for seq, row in zip(sampled, logits, strict=True))
        return logits


def assert_matches_reference(model: LlamaModel, spy: LogitsSpy) -> None:
    assert spy.rows, "nothing was sampled"
    references: dict[int, torch.Tensor] = {}
    for seq, num_tokens, logits in spy.rows:
        if id(seq) not in references:
            references[id(seq)] = model.reference_logits(torch.tensor(seq.token_ids[:-1]))  # [N - 1, V]
        expected = references[id(seq)][num_tokens - 1]
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
