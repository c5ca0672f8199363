"""Batch-invariant paged attention: every query token, prefill or decode, goes through one decode-shaped call.

The contract (docs/design.md §8): a token's attention output has the same bits whether it is a decode, a row of a
prefill chunk of any size, the one-token remainder after a prefix-cache hit, or a recompute after
preemption, and whatever else shares the step. Kernels choose their blocking from the shapes they see, so each
token is given one shape that depends on its own position only:
- queries: the token's G query heads of one KV head, `q: [R, KH, G, D]` (never a prefill-length query axis);
- keys: the first `L_pad` slots of its sequence, `L_pad` = its position + 1 rounded up to a fixed split of
  `split_tokens` (a multiple of the block size), with a boolean mask hiding the slots past its position.
Tokens of one split bucket from different sequences (decodes) share one call over gathered blocks; the tokens
of one prefill chunk in one bucket share one call whose keys are the sequence's blocks expanded (stride 0),
never copied per token. The kernel (torch SDPA, the CPU flash kernel on CPU) works per (row, KV head), so
the number of rows in a call does not reach a row's reduction order; tests/backend/test_batch_invariance.py
checks this end to end. On CUDA the call is pinned to torch's memory-efficient kernel, which walks the keys
of each (row, head) in one fixed order (flash-attn's decode kernel, by contrast, picks its number of KV splits
from the batch size, and the math path's batched GEMMs pick kernels by batch count).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from backend.attention.backend import write_kv
from backend.attention.context import AttentionContext

# Key split, rounded up to a multiple of the block size. Any split is invariant (a row's padded key length
# depends on its own position only); a short one pads less (a 100-token sequence reads 128 keys, not 256) at
# the price of more calls when a batch spans several buckets. 64 against 256, SmolLM2 on the 2-core machine
# (CPU time per step): 8 concurrent decodes -25%, prefill of 250 tokens -15%, batch 1 -5%.
SPLIT_TOKENS = 64


@dataclass(frozen=True, slots=True)
class _Call:
    token_index: torch.Tensor  # [R] int64, rows of q
    block_ids: torch.Tensor  # [S * nb] int64, S = R (gathered) or 1 (one sequence, expanded over R)
    num_seqs: int  # S
    mask: torch.Tensor  # [R, 1, 1, nb * block_size] bool, True where the key is visible to the row
    # the additive form SDPA turns a bool mask into (0 / -inf in q's dtype), built once per step, not per layer
    additive: dict[torch.dtype, torch.Tensor]

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        found = self.additive.get(dtype)
        if found is None:
            found = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            found = self.additive[dtype] = found.masked_fill_(~self.mask, float("-inf"))
        return found


@dataclass(frozen=True, slots=True)
class InvariantPlan:
    ctx: AttentionContext
    calls: tuple[_Call, ...]
    in_order: bool  # a single call covering every token in token order


def split_tokens_for(block_size: int, split_tokens: int = SPLIT_TOKENS) -> int:
    return -(-split_tokens // block_size) * block_size


class InvariantSdpaBackend:
    name = "sdpa-invariant"

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        split_tokens: int = SPLIT_TOKENS,
    ) -> None:
        assert num_heads % num_kv_heads == 0
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_heads // num_kv_heads
        self.block_size = block_size
        self.split = split_tokens_for(block_size, split_tokens)
        self.one_row_calls = False  # every query token in its own call (`calibrate`)
        # (dtype, device) of a calibration deferred to the first plan (`defer_calibration`)
        self._deferred: tuple[torch.dtype, torch.device | str] | None = None

    def defer_calibration(self, dtype: torch.dtype, device: torch.device | str) -> None:
        """`calibrate` before the first `plan`, not now: an engine whose model runs the native decoder step
        (backend/model/native_step.py) never plans, and skips the measurement (about 1 s at start)."""
        self._deferred = (dtype, device)

    @torch.inference_mode()
    def calibrate(self, dtype: torch.dtype, device: torch.device | str) -> None:
        """Measure whether a row's bits depend on the other rows of its call, and if so give every query token
        a call of its own. Measured on an AMD EPYC with 2 threads: SmolLM2's fp32 attention gives row 0 other
        bits in a call of 2+ rows than alone (1 thread: the same bits). The likely mechanism: torch's CPU flash
        kernel splits a call's (row, KV head) items between threads in contiguous runs, so the number of rows
        decides which thread runs a row, each thread's scratch buffer sits at an offset that in fp32 need not
        be 16-byte aligned, and MKL's sgemm sums by alignment there. The probe runs the very calls `forward`
        makes, gathered and expanded, on random inputs."""
        dev = torch.device(device)
        shape = (self.num_heads, self.num_kv_heads, self.head_dim, self.block_size, self.split)
        self.one_row_calls = not _rows_stand_alone(shape, dtype, dev, torch.get_num_threads())

    def plan(self, ctx: AttentionContext) -> InvariantPlan:
        if self._deferred is not None:
            dtype, device = self._deferred
            self._deferred = None
            self.calibrate(dtype, device)
        device = ctx.block_tables.device
        starts = ctx.query_start_host
        singles: dict[int, list[tuple[int, int, int]]] = {}  # bucket -> (token index, seq, length)
        calls: list[_Call] = []
        for i, (n, length) in enumerate(zip(ctx.query_lens, ctx.context_lens_host, strict=True)):
            first_len = length - n + 1  # the first new token sees this many keys
            token = starts[i]
            while token < starts[i] + n:
                row_len = first_len + token - starts[i]
                bucket = -(-row_len // self.split)
                end = min(starts[i] + n, token + bucket * self.split - row_len + 1)
                if self.one_row_calls:
                    calls += [
                        self._gathered(ctx, [(t, i, row_len + t - token)], bucket, device)
                        for t in range(token, end)
                    ]
                elif end - token == 1:
                    singles.setdefault(bucket, []).append((token, i, row_len))
                else:
                    calls.append(self._segment(ctx, i, token, end, row_len, bucket, device))
                token = end
        for bucket, rows in sorted(singles.items()):
            calls.append(self._gathered(ctx, rows, bucket, device))
        in_order = len(calls) == 1 and (
            len(singles) == 0
            or [t for t, _, _ in next(iter(singles.values()))] == list(range(ctx.num_tokens))
        )
        return InvariantPlan(ctx, tuple(calls), in_order)

    def _segment(
        self,
        ctx: AttentionContext,
        seq: int,
        start: int,
        end: int,
        first_len: int,
        bucket: int,
        dev: torch.device,
    ) -> _Call:
        """Rows start..end-1 of sequence `seq` (one bucket), over its blocks expanded across the rows."""
        num_blocks = bucket * self.split // ctx.block_size
        lens = torch.arange(first_len, first_len + end - start, device=dev)  # [R]
        visible = torch.arange(bucket * self.split, device=dev)[None, :] < lens[:, None]  # [R, L_pad]
        index = torch.arange(start, end, device=dev)
        return _Call(index, _blocks(ctx, [seq], num_blocks), 1, visible[:, None, None, :], {})

    def _gathered(
        self, ctx: AttentionContext, rows: list[tuple[int, int, int]], bucket: int, dev: torch.device
    ) -> _Call:
        """One row from each of several sequences (decodes), each over its own gathered blocks."""
        num_blocks = bucket * self.split // ctx.block_size
        lens = torch.tensor([length for _, _, length in rows], device=dev)  # [R]
        visible = torch.arange(bucket * self.split, device=dev)[None, :] < lens[:, None]  # [R, L_pad]
        index = torch.tensor([token for token, _, _ in rows], device=dev)
        blocks = _blocks(ctx, [s for _, s, _ in rows], num_blocks)
        return _Call(index, blocks, len(rows), visible[:, None, None, :], {})

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: object,
    ) -> torch.Tensor:
        assert isinstance(plan, InvariantPlan)
        # q: [T, H, D]; k, v: [T, KH, D]; caches: [num_blocks, block_size, KH, D]
        write_kv(k, v, k_cache, v_cache, plan.ctx.slot_mapping)
        if plan.in_order:  # one call whose rows are the step's tokens in order (a decode batch, one chunk)
            return self._attend(q, k_cache, v_cache, plan.calls[0])
        out = torch.empty_like(q)  # [T, H, D]
        for call in plan.calls:
            out[call.token_index] = self._attend(q[call.token_index], k_cache, v_cache, call)
        return out

    def _attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, call: _Call
    ) -> torch.Tensor:
        # q: [R, H, D] -> [R, H, D]
        rows, kv_heads, head_dim = q.shape[0], self.num_kv_heads, self.head_dim
        qr = aligned_heads(q.reshape(rows, kv_heads, self.group, head_dim))  # [R, KH, G, D]
        seqs = call.num_seqs
        keys = k_cache.index_select(0, call.block_ids).view(seqs, -1, kv_heads, head_dim).transpose(1, 2)
        values = v_cache.index_select(0, call.block_ids).view(seqs, -1, kv_heads, head_dim).transpose(1, 2)
        # keys, values: [S, KH, L, D]
        if seqs != rows:  # one sequence's keys for all its rows: a stride-0 view, no copy
            keys = keys.expand(rows, -1, -1, -1)  # [R, KH, L, D]
            values = values.expand(rows, -1, -1, -1)  # [R, KH, L, D]
        mask = call.additive_mask(q.dtype)  # [R, 1, 1, L]
        if qr.is_cuda:
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                out = F.scaled_dot_product_attention(qr, keys, values, attn_mask=mask)  # [R, KH, G, D]
        else:
            out = F.scaled_dot_product_attention(qr, keys, values, attn_mask=mask)  # [R, KH, G, D]
        return out.reshape(rows, self.num_heads, head_dim)


@functools.lru_cache(maxsize=64)
def _rows_stand_alone(
    shape: tuple[int, int, int, int, int], dtype: torch.dtype, device: torch.device, threads: int
) -> bool:
    """Whether every row of calls of 2..16 rows, over one or two key splits, gets the bits of its one-row call
    (kept per shape, dtype, device and thread count: engines of one model do not measure again)."""
    heads, kv_heads, dim, block, split = shape  # the backend's heads, KV heads, head dim, block size, split
    backend = InvariantSdpaBackend(heads, kv_heads, dim, block, split)
    gen = torch.Generator().manual_seed(0)
    per_split = split // block
    most = 16
    k_cache, v_cache = (
        torch.randn(most * 2 * per_split, block, kv_heads, dim, generator=gen).to(device=device, dtype=dtype)
        for _ in range(2)
    )  # [num_blocks, block_size, KH, D]
    for rows in (2, 3, 5, 8, most):
        for splits in (1, 2):
            nb, length = splits * per_split, splits * split
            q = torch.randn(rows, heads, dim, generator=gen).to(device=device, dtype=dtype)  # [R, H, D]
            lens = torch.randint(1, length + 1, (rows,), generator=gen)  # [R]
            visible = torch.arange(length)[None, :] < lens[:, None]  # [R, L]
            visible = visible.to(device)[:, None, None, :]  # [R, 1, 1, L]
            blocks = torch.arange(rows * nb, device=device)  # row r reads blocks r*nb .. r*nb + nb - 1
            index = torch.arange(rows, device=device)
            gathered = _Call(index, blocks, rows, visible, {})
            expanded = _Call(index, blocks[:nb], 1, visible, {})
            for call, own in ((gathered, True), (expanded, False)):
                together = backend._attend(q, k_cache, v_cache, call)  # [R, H, D]
                for r in range(rows):
                    ids = blocks[r * nb : (r + 1) * nb] if own else blocks[:nb]
                    alone = backend._attend(
                        q[r : r + 1].clone(),
                        k_cache,
                        v_cache,
                        _Call(index[:1], ids, 1, visible[r : r + 1], {}),
                    )
                    if not torch.equal(together[r : r + 1], alone):
                        return False
    return True


def aligned_heads(q: torch.Tensor) -> torch.Tensor:
    """q itself where every head vector starts on a 64-byte boundary, else q's values in a buffer whose last dim
    is zero-padded to a multiple of 64 bytes (a view of its first D values), so a head vector's alignment does
    not depend on its row's place in the call. fp32 SDPA on CPU runs MKL's sgemm over each [G, D] query block,
    which sums a row differently by its address modulo 16 bytes on some CPUs (measured on an AMD EPYC: head_dim
    14, every other row). Never a copy for head dims of 16 fp32 / 32 bf16 multiples (every Llama's)."""
    # q: [R, KH, G, D]
    step = 64 // q.element_size()
    aligned = q.stride(-1) == 1 and q.storage_offset() % step == 0
    for dim in range(q.dim() - 1):
        if q.size(dim) > 1 and q.stride(dim) % step != 0:
            aligned = False
    if aligned:
        return q
    width = q.size(-1)
    shape = list(q.shape)
    shape[-1] = -(-width // step) * step
    padded = q.new_zeros(shape)  # [R, KH, G, D rounded up]
    padded[..., :width].copy_(q)
    return padded[..., :width]


def _blocks(ctx: AttentionContext, seqs: list[int], num_blocks: int) -> torch.Tensor:
    """[len(seqs) * num_blocks] int64 block ids, row-major, padded with block 0 (masked) past each table's end."""
    table = ctx.block_tables[torch.tensor(seqs, device=ctx.block_tables.device)].long()  # [S, max_blocks]
    if table.shape[1] >= num_blocks:
        return table[:, :num_blocks].flatten()
    return F.pad(table, (0, num_blocks - table.shape[1])).flatten()
