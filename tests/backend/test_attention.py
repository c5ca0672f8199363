"""Attention backends against the naive paged reference on random pools; flash paths only where CUDA is."""

from __future__ import annotations

import pytest
import torch

from backend.attention.backend import AttentionBackend, write_kv
from backend.attention.context import AttentionContext
from backend.attention.invariant import InvariantSdpaBackend
from backend.attention.reference import reference_paged_attention
from backend.attention.sdpa import SdpaBackend
from backend.attention.selector import default_block_size, make_attention_backend, resolve_attention

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def random_step(
    query_lens: list[int],
    context_lens: list[int],
    block_size: int,
    num_blocks: int,
    dtype: torch.dtype,
    device: str,
) -> tuple[AttentionContext, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step over a random pool: sequences own shuffled, non-contiguous blocks; returns ctx, q, k, v, caches."""
    gen = torch.Generator().manual_seed(0)
    shape = (num_blocks, block_size, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(device, dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, dtype)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-length // block_size))] for length in context_lens]
    width = max(len(t) for t in tables)
    slots = [
        t[p // block_size] * block_size + p % block_size
        for t, n, c in zip(tables, query_lens, context_lens, strict=True)
        for p in range(c - n, c)
    ]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    ctx = AttentionContext(
        slot_mapping=torch.tensor(slots, device=device),
        block_tables=torch.tensor(
            [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device
        ),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        query_lens=tuple(query_lens),
        context_lens_host=tuple(context_lens),
        block_size=block_size,
    )
    total = sum(query_lens)
    q = torch.randn(total, HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    return ctx, q, k, v, k_cache, v_cache


def run_backend(backend: AttentionBackend, step: tuple) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[type-arg]
    ctx, q, k, v, k_cache, v_cache = step
    out = backend.forward(q, k, v, k_cache, v_cache, backend.plan(ctx))
    return out, reference_paged_attention(q, k_cache, v_cache, ctx)


# decodes, a fresh prefill, a prefill chunk over a cached prefix, all in one step
MIXED = ([1, 1, 20, 7, 1], [1, 37, 20, 40, 16])


def test_write_kv_puts_each_token_in_its_slot() -> None:
    ctx, _, k, v, k_cache, v_cache = random_step([3], [3], 4, 6, torch.float32, "cpu")
    write_kv(k, v, k_cache, v_cache, ctx.slot_mapping)
    block = int(ctx.block_tables[0, 0])
    torch.testing.assert_close(k_cache[block, :3], k)
    torch.testing.assert_close(v_cache[block, :3], v)


@pytest.mark.parametrize("query_lens, context_lens", [MIXED, ([1, 1, 1], [5, 16, 33]), ([9], [9])])
def test_sdpa_matches_the_reference(query_lens: list[int], context_lens: list[int]) -> None:
    out, expected = run_backend(
        SdpaBackend(HEADS, KV_HEADS, HEAD_DIM),
        random_step(query_lens, context_lens, 4, 48, torch.float32, "cpu"),
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_auto_selects_sdpa_on_cpu_and_flash_is_refused() -> None:
    assert resolve_attention("auto", "cpu", torch.bfloat16, 256) == "sdpa"
    with pytest.raises(ValueError):
        resolve_attention("flash", "cpu", torch.bfloat16, 256)
    backend = make_attention_backend(
        "auto",
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        block_size=16,
        device="cpu",
        dtype=torch.float32,
    )
    assert backend.name == "sdpa"
    assert default_block_size("cpu", torch.bfloat16) == 16


@needs_cuda
def test_sdpa_with_torch_flash_prefill_matches_the_reference_on_cuda() -> None:
    backend = SdpaBackend(HEADS, KV_HEADS, HEAD_DIM, cuda_flash_prefill=True)
    out, expected = run_backend(backend, random_step(*MIXED, 16, 48, torch.bfloat16, "cuda"))
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@needs_cuda
def test_flash_attn_matches_the_reference_on_cuda() -> None:
    pytest.importorskip("flash_attn")
    from backend.attention.flash import FlashBackend

    backend = FlashBackend(HEADS, KV_HEADS, HEAD_DIM, block_size=256)
    for query_lens, context_lens in (MIXED, ([1, 1, 1], [5, 300, 700])):
        out, expected = run_backend(
            backend, random_step(query_lens, context_lens, 256, 12, torch.bfloat16, "cuda")
        )
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_one_row_calls_give_each_query_token_its_own_call() -> None:
    step = random_step(*MIXED, 16, 64, torch.float32, "cpu")
    backend = InvariantSdpaBackend(HEADS, KV_HEADS, HEAD_DIM, 16)
    backend.one_row_calls = True
    plan = backend.plan(step[0])
    assert [call.token_index.numel() for call in plan.calls] == [1] * sum(MIXED[0])
    assert sorted(int(call.token_index) for call in plan.calls) == list(range(sum(MIXED[0])))
    out, ref = run_backend(backend, step)
    torch.testing.assert_close(out, ref)


def test_the_calibrated_backend_keeps_a_row_s_bits_in_any_call_at_two_threads() -> None:
    """SmolLM2's attention shape in fp32 with 2 threads (where an AMD EPYC's rows depend on their call): each
    query token of a mixed step gets the bits it gets as the only token of its step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        heads, kv_heads, dim = 9, 3, 64
        backend = make_attention_backend(
            "auto", num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, block_size=16, device="cpu",
            dtype=torch.float32, batch_invariant=True,
        )  # fmt: skip
        assert isinstance(backend, InvariantSdpaBackend)
        gen = torch.Generator().manual_seed(1)
        caches = torch.randn(2, 32, 16, kv_heads, dim, generator=gen)  # k, v: [num_blocks, block_size, KH, D]
        q = torch.randn(6, heads, dim, generator=gen)  # [T, H, D]: decodes of 6 sequences
        kv = torch.randn(2, 6, kv_heads, dim, generator=gen)
        tables = torch.arange(30, dtype=torch.int32).view(6, 5)
        lens = [7, 20, 33, 50, 64, 70]

        def step(rows: list[int]) -> AttentionContext:
            return AttentionContext(
                slot_mapping=torch.tensor([int(tables[r, (lens[r] - 1) // 16]) * 16 + (lens[r] - 1) % 16 for r in rows]),
                block_tables=tables[rows], context_lens=torch.tensor([lens[r] for r in rows], dtype=torch.int32),
                query_start_loc=torch.arange(len(rows) + 1, dtype=torch.int32), query_lens=(1,) * len(rows),
                context_lens_host=tuple(lens[r] for r in rows), block_size=16,
            )  # fmt: skip

        together = backend.forward(q, kv[0], kv[1], caches[0], caches[1], backend.plan(step(list(range(6)))))
        for r in range(6):
            one = step([r])
            alone = backend.forward(
                q[r : r + 1], kv[0][r : r + 1], kv[1][r : r + 1], caches[0], caches[1], backend.plan(one)
            )
            assert torch.equal(together[r], alone[0]), (r, backend.one_row_calls)
    finally:
        torch.set_num_threads(threads)
