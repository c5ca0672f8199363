"""The per-step attention context: where each new token's K/V goes and which blocks each sequence reads.

Built once per engine step by the ModelRunner and shared by every layer. Tensors live on the model device;
the host-side tuples (`query_lens`, `context_lens_host`, `query_start_host`) mirror them so backends plan
without reading a tensor back from the device (a sync on CUDA, an op dispatch on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch


@dataclass(frozen=True, slots=True)
class AttentionContext:
    # slot_mapping: [T] int64, flat slot (block * block_size + offset) of each new token
    slot_mapping: torch.Tensor
    # block_tables: [B, max_blocks] int32, padded with 0 past each sequence's blocks
    block_tables: torch.Tensor
    # context_lens: [B] int32, tokens in the cache for each sequence once this step's tokens are written
    context_lens: torch.Tensor
    # query_start_loc: [B + 1] int32, offsets of each sequence's new tokens in the flattened batch
    query_start_loc: torch.Tensor
    query_lens: tuple[int, ...]
    context_lens_host: tuple[int, ...]
    block_size: int

    def __post_init__(self) -> None:
        num_seqs = len(self.query_lens)
        assert num_seqs > 0, "an attention step needs at least one sequence"
        assert len(self.context_lens_host) == num_seqs
        assert self.block_tables.dim() == 2 and self.block_tables.shape[0] == num_seqs
        assert self.context_lens.shape == (num_seqs,)
        assert self.query_start_loc.shape == (num_seqs + 1,)
        assert self.slot_mapping.shape == (sum(self.query_lens),)
        assert all(0 < q <= c for q, c in zip(self.query_lens, self.context_lens_host, strict=True))
        assert self.block_tables.shape[1] * self.block_size >= max(self.context_lens_host)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def query_start_host(self) -> tuple[int, ...]:
        """[B + 1] offsets of each sequence's new tokens, on the host (no read back from the device)."""
        return (0, *accumulate(self.query_lens))

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_context_len(self) -> int:
        return max(self.context_lens_host)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
