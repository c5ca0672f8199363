"""The paged FlashAttention kernel in Triton: one program per (sequence, KV head, tile of new tokens).

A program holds the G query heads that share its KV head for `BLOCK_M // GROUP_PAD` of the sequence's new tokens
(rows ordered (token, head)), so K/V are read once per KV head. It walks the sequence's keys from position 0 in
tiles of `BLOCK_N`, looking each key's slot up through the block table (any block size), with an online softmax
in fp32 (exp2, the scale folded into log2 e). Queries attend causally, aligned to the end: the query at position
`L - n + i` of a sequence with `n` new tokens and `L` cached ones sees keys `<= L - n + i`, so one kernel serves
decode, a fresh prefill and a chunk over a cached prefix.

Batch-invariant by construction: the tile shapes are constants of the model (never of the batch), a program
reads its own sequence only, and a row's reduction visits the same key tiles in the same order whatever its
program's other rows are. The tiles a row cannot see leave its state bit for bit unchanged (its running max
stays put, so the rescale factor is exactly 1 and the added probabilities exactly 0). Slots past the sequence
are never loaded (masked to 0), so whatever an unused slot holds (NaN, huge) cannot reach a result.

Written to Triton 3.6 and 3.7 (the versions torch 2.11 and 2.13 pin); importing this module imports triton, so
`TRITON_INTERPRET=1` (Triton's CPU interpreter, what CI runs it under) must be set before the first import.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in fp32; UPCAST feeds fp32 operands (exact for bf16: its products fit in fp32), for
    Triton's interpreter, whose dot multiplies bf16 bit patterns (triton-lang/triton#11584, not supported)."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def _walk_keys(
    q,  # [BLOCK_M, BLOCK_D] the program's query rows
    q_pos,  # [BLOCK_M] position of each row's token
    last,  # keys the program's last row sees
    kv_len,
    k_base,  # k_cache_ptr at the program's KV head
    v_base,
    table,  # block_tables_ptr at the program's sequence
    scale_log2,
    stride_kb, stride_ks, stride_kd,
    stride_vb, stride_vs, stride_vd,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, MASK_SHIFT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Online softmax over keys 0..last-1 in tiles of BLOCK_N, in order: [BLOCK_M, BLOCK_D] fp32 output."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    keys = tl.arange(0, BLOCK_N)
    for tile in range(0, tl.cdiv(last, BLOCK_N)):
        pos = tile * BLOCK_N + keys  # [BLOCK_N]
        pos_ok = pos < kv_len  # slots past the sequence are never read
        block = tl.load(table + pos // BLOCK_SIZE, mask=pos_ok, other=0)  # [BLOCK_N] int32
        block = block.to(tl.int64)  # block x its stride passes 2^31 elements in a large pool
        slot = pos % BLOCK_SIZE
        kv_ok = pos_ok[:, None] & d_ok[None, :]  # [BLOCK_N, BLOCK_D]
        k_off = block[:, None] * stride_kb + slot[:, None] * stride_ks + d[None, :] * stride_kd
        k = tl.load(k_base + k_off, mask=kv_ok, other=0.0)  # [BLOCK_N, BLOCK_D]
        s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale_log2  # [BLOCK_M, BLOCK_N] fp32
        s = tl.where(pos[None, :] <= q_pos[:, None] + MASK_SHIFT, s, float("-inf"))  # causal, end-aligned
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)  # exactly 1 where the tile left the max alone
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        total = total * alpha + tl.sum(p, 1)
        v_off = block[:, None] * stride_vb + slot[:, None] * stride_vs + d[None, :] * stride_vd
        v = tl.load(v_base + v_off, mask=kv_ok, other=0.0)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m = m_new
    return acc / total[:, None]


@triton.jit
def paged_attention_kernel(
    q_ptr,  # [T, H, D], any strides
    k_cache_ptr,  # [num_blocks, block_size, KH, D]
    v_cache_ptr,  # [num_blocks, block_size, KH, D]
    out_ptr,  # [T, H, D], last dim contiguous
    block_tables_ptr,  # [B, max_blocks] int32
    context_lens_ptr,  # [B] int32, L per sequence, this step's tokens included
    query_start_ptr,  # [B + 1] int32
    scale_log2,  # softmax scale x log2(e)
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ot, stride_oh,
    stride_bt,
    BLOCK_SIZE: tl.constexpr,  # tokens per paged KV block
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two, >= 16
    BLOCK_M: tl.constexpr,  # rows per program: tokens x GROUP_PAD
    BLOCK_N: tl.constexpr,  # keys per tile
    MASK_SHIFT: tl.constexpr,  # 0; tests plant 1 or -1 to see the comparison with the reference fail
    PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no tf32), else the default
    UPCAST: tl.constexpr,  # fp32 dot operands (the interpreter's bf16)
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    TOKENS: tl.constexpr = BLOCK_M // GROUP_PAD
    first = tl.program_id(2) * TOKENS
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    if first < q_len:
        kv_len = tl.load(context_lens_ptr + seq)
        rows = tl.arange(0, BLOCK_M)
        token = first + rows // GROUP_PAD  # [BLOCK_M], index among the sequence's new tokens
        group = rows % GROUP_PAD
        row_ok = (token < q_len) & (group < GROUP)
        token = tl.minimum(token, q_len - 1)  # padding rows repeat a real one: every row sees key 0
        head = kv_head * GROUP + tl.minimum(group, GROUP - 1)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q_off = (q_start + token)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd
        q = tl.load(q_ptr + q_off, mask=d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        out = _walk_keys(
            q,
            kv_len - q_len + token,
            kv_len - q_len + tl.minimum(first + TOKENS, q_len),
            kv_len,
            k_cache_ptr + kv_head * stride_kh,
            v_cache_ptr + kv_head * stride_vh,
            block_tables_ptr + seq * stride_bt,
            scale_log2,
            stride_kb, stride_ks, stride_kd,
            stride_vb, stride_vs, stride_vd,
            BLOCK_SIZE, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, MASK_SHIFT, PRECISION, UPCAST,
        )  # fmt: skip
        o_off = (q_start + token)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
