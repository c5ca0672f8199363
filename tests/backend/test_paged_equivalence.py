"""Paged-KV logits equal the full-recompute reference, whatever the batching, chunking, sharing or preemption."""

from __future__ import annotations

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from harness.logits_spy import LogitsSpy, assert_matches_reference
from harness.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def prompts(lengths: list[int], seed: int = 0, prefix: list[int] | None = None) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [(prefix or []) + torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]


def test_long_prompt_chunked_prefill_and_decode_across_blocks() -> None:
    model = tiny_model()
    engine = LLMEngine(
        model,
        EngineConfig(speculative_tokens=0, num_blocks=32, max_num_batched_tokens=24, max_model_len=256),
        frozenset(),
    )
    spy = LogitsSpy(engine)
    (out,) = engine.generate(prompts([100]), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert len(out) == 40  # 100 + 40 tokens: 9 blocks, the decode crosses 112 and 128
    assert len(spy.rows) == 40
    assert_matches_reference(model, spy)


def test_mixed_batch_of_different_lengths() -> None:
    model = tiny_model()
    engine = LLMEngine(
        model,
        EngineConfig(speculative_tokens=0, num_blocks=64, max_num_batched_tokens=48, max_model_len=256),
        frozenset(),
    )
    spy = LogitsSpy(engine)
    outs = engine.generate(prompts([3, 17, 50, 90]), GREEDY)
    assert [len(o) for o in outs] == [24] * 4
    assert_matches_reference(model, spy)


def test_shared_prefix_blocks_are_reused_and_exact() -> None:
    model = tiny_model()
    engine = LLMEngine(
        model,
        EngineConfig(speculative_tokens=0, num_blocks=64, max_num_batched_tokens=64, max_model_len=256),
        frozenset(),
    )
    prefix = prompts([48], seed=1)[0]  # three full blocks
    engine.generate(prompts([5], seed=2, prefix=prefix), GREEDY)
    spy = LogitsSpy(engine)
    seqs = [
        engine.add_request(f"r{i}", engine.prompt(p), GREEDY)
        for i, p in enumerate(prompts([7, 20, 33], seed=3, prefix=prefix))
    ]
    while engine.has_unfinished():
        engine.step()
    assert all(s.num_cached_tokens == 48 for s in seqs)
    assert spy.max_ref_count > 1
    assert_matches_reference(model, spy)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_exact_after_preemption_and_resume_with_shared_prefixes() -> None:
    model = tiny_model()
    # 10 blocks of 16: four requests of ~40-60 tokens + 24 generated cannot all fit at once
    config = EngineConfig(speculative_tokens=0, num_blocks=10, max_num_batched_tokens=64, max_model_len=160)
    engine = LLMEngine(model, config, frozenset())
    spy = LogitsSpy(engine)
    prefix = prompts([32], seed=4)[0]
    outs = engine.generate(prompts([9, 18, 27, 3], seed=5, prefix=prefix), GREEDY)
    assert [len(o) for o in outs] == [24] * 4
    assert engine.scheduler.num_preemptions_total > 0
    assert spy.max_ref_count > 1
    assert_matches_reference(model, spy)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_bf16_weights_and_kv_stay_close_to_the_bf16_reference() -> None:
    model = tiny_model(dtype=torch.bfloat16)
    engine = LLMEngine(
        model,
        EngineConfig(speculative_tokens=0, num_blocks=32, max_num_batched_tokens=32, max_model_len=256),
        frozenset(),
    )
    assert engine.pool.k_caches[0].dtype == torch.bfloat16
    spy = LogitsSpy(engine)
    engine.generate(prompts([40, 7]), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    worst = 0.0
    for seq, num_tokens, logits in spy.rows:
        assert logits.dtype == torch.float32
        expected = model.reference_logits(torch.tensor(seq.token_ids[:num_tokens]))[-1]
        worst = max(worst, (logits - expected).abs().max().item())
    assert worst < 0.1
