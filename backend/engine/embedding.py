"""The embedding kind of sequence: a prefill-only request whose result is a pooled hidden state, not tokens.

An `EmbeddingSequence` is scheduled like any prompt (same token budget, chunked prefill, prefix reuse,
preemption by recompute) and batched with generating sequences in the same steps. It never samples: when
its last chunk runs, the model runner stores the final-norm hidden state of its last token (last-token
pooling, see `POOLING`) on it, and the engine finishes it with one `EmbeddingOut`.

Last-token pooling is exact under prefix reuse and preemption: the last token is always computed (the KV
manager leaves at least one token to compute), and under causal attention it is the one position that
attends to the whole input. Normalization is the server's business (backend/server/embeddings.py).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Literal

import torch

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence

POOLING = "last"  # llama.cpp's LLAMA_POOLING_TYPE_LAST: the final-norm hidden state of the last token

_NO_SAMPLING = SamplingParams(max_tokens=1)  # never used for sampling: the sequence only prefills


class EmbeddingSequence(Sequence):
    __slots__ = ("embedding",)

    def __init__(self, request_id: str, prompt_ids: Seq[int]) -> None:
        super().__init__(request_id, prompt_ids, _NO_SAMPLING)
        self.embedding: torch.Tensor | None = None  # [hidden] fp32, set when the last chunk has run


@dataclass(frozen=True, slots=True)
class EmbeddingOut:
    """The pooled (not yet normalized) final-norm hidden state of one embedding request, on the CPU."""

    vector: torch.Tensor  # [hidden] fp32
    num_prompt_tokens: int
    num_cached_tokens: int
    finish_reason: Literal["stop"] = "stop"  # an embedding is one delivery, always the last
