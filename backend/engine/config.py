"""Engine configuration: pool geometry, batching limits, the attention backend choice, batch invariance and
speculation. The one home of these fields and their defaults: the served backend's configuration holds an
`EngineConfig` as its `engine` section (backend/config.py), so its flags and environment variables set these.

`batch_invariant` (default on, docs/design.md §8): a sequence's logits have the same bits whatever else is batched,
however its prefill is chunked and whether its prefix came from the cache; off trades that for throughput.
`speculative_tokens` (default 3): prompt-lookup drafts per verify forward for greedy requests
(backend/engine/speculative.py). A verify of k + 1 rows costs more than a one-row step, so drafts pay where they are
accepted: copy-heavy prompts (`bench speculative`: 1.3-1.5x with k = 2-3), while on free text about 20% are kept
and speculation is roughly neutral (docs/performance.md). A request drafts on past its probe only while the share of
its drafts accepted beats what a row costs here, timed on the engine's own decode steps (`speculative.RowCost`:
about 0.1-0.3 of a step on the AVX512 build, about half on the AVX2 build at one thread, where drafts that
did not pay cost 20% of batch-1 decode before the gate). Speculation is exact only on batch-invariant kernels (a
k-token verify equals k single steps bitwise), so it is off whenever `batch_invariant` is: `draft_tokens` is what
the engine uses.
`cuda_graphs` (default off until measured on a GPU): decode-only steps replay a CUDA graph captured per batch bucket
(backend/engine/cuda_graphs.py); only on CUDA, with the Triton or flash attention backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

_ATTENTION = ("auto", "sdpa", "flash", "triton")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    block_size: int = 16  # any size on CPU and with Triton; a multiple of 256 with flash-attn
    num_blocks: int = 2048
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_model_len: int = 4096  # the server clamps it to the model's max_position_embeddings
    attention: Literal["auto", "sdpa", "flash", "triton"] = "auto"
    device: str = "cpu"
    max_waiting: int = 256
    enable_prefix_caching: bool = True
    speculative_tokens: int = 3  # drafts per verify for greedy requests, 0 = off (see draft_tokens)
    batch_invariant: bool = True
    cuda_graphs: bool = False  # capture decode steps per batch bucket (backend/engine/cuda_graphs.py)

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "num_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "max_waiting",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.speculative_tokens, int) or self.speculative_tokens < 0:
            raise ValueError(f"EngineConfig.speculative_tokens must be >= 0, got {self.speculative_tokens!r}")
        if self.attention not in _ATTENTION:
            raise ValueError(f"EngineConfig.attention must be one of {_ATTENTION}, got {self.attention!r}")
        if self.num_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"the pool ({self.num_blocks} blocks x {self.block_size}) cannot hold one sequence of "
                f"max_model_len={self.max_model_len}"
            )

        if self.cuda_graphs:
            self._check_cuda_graphs()

    def _check_cuda_graphs(self) -> None:
        """Graphs capture CUDA work, and only backends whose decode reads its lengths on the device (the engine
        checks the backend `auto` resolves to); their scratch block comes out of the pool."""
        if self.device.split(":")[0] != "cuda":
            raise ValueError(f"EngineConfig.cuda_graphs needs a CUDA device, got device={self.device!r}")
        if self.attention == "sdpa":
            raise ValueError(
                "EngineConfig.cuda_graphs needs attention 'triton', 'flash' or 'auto', got 'sdpa'"
            )
        if (self.num_blocks - 1) * self.block_size < self.max_model_len:
            raise ValueError(
                f"with cuda_graphs the pool ({self.num_blocks} blocks x {self.block_size}, one kept as the "
                f"graphs' scratch block) cannot hold one sequence of max_model_len={self.max_model_len}"
            )

    @property
    def draft_tokens(self) -> int:
        """The drafts per verify the engine uses: `speculative_tokens`, or 0 without batch-invariant kernels."""
        return self.speculative_tokens if self.batch_invariant else 0

    @staticmethod
    def default_block_size(uses_flash_attn: bool) -> int:
        return 256 if uses_flash_attn else 16
