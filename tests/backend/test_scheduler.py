"""Scheduler: chunked prefill within the token budget, preemption by recompute, no lost requests or blocks, and
speculative drafts that ride on the scheduled step (never in the sequence), granted within the budget."""

from __future__ import annotations

import pytest
import torch

from backend.engine.block_pool import BlockPool, chain_hash
from backend.engine.config import EngineConfig
from backend.engine.kv_cache_manager import KVCacheManager
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.engine.scheduler import Scheduler
from backend.engine.sequence import Sequence, SequenceStatus
from harness.logits_spy import LogitsSpy, assert_matches_reference
from harness.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def make_scheduler(num_blocks: int, budget: int, block_size: int = 4, max_num_seqs: int = 8) -> Scheduler:
    config = EngineConfig(
        speculative_tokens=0,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=num_blocks * block_size,
    )
    pool = BlockPool(num_blocks, block_size, 1, 1, 2, torch.float32, "cpu")
    return Scheduler(config, KVCacheManager(pool), frozenset())


def run_step(scheduler: Scheduler) -> list[tuple[str, int]]:
    """Schedule and pretend the model ran: sample token 7 for every sequence that reached its end."""
    batch = scheduler.schedule()
    scheduler.postprocess(batch, [7 if item.samples else None for item in batch])
    return [(item.seq.request_id, item.num_new_tokens) for item in batch]


def test_chunked_prefill_respects_the_token_budget() -> None:
    scheduler = make_scheduler(num_blocks=32, budget=10)
    scheduler.add(Sequence("long", list(range(25)), GREEDY))
    scheduler.add(Sequence("short", [1, 2, 3], GREEDY))
    steps = [run_step(scheduler) for _ in range(4)]
    assert steps[0] == [("long", 10)]
    assert steps[1] == [("long", 10)]
    assert steps[2] == [
        ("long", 5),
        ("short", 3),
    ]  # the prompt's rest, then the next request fills the budget
    assert steps[3] == [("long", 1), ("short", 1)]  # both decode
    assert all(sum(n for _, n in step) <= 10 for step in steps)


def test_running_decodes_go_before_a_long_prefill_chunk() -> None:
    scheduler = make_scheduler(num_blocks=32, budget=10)
    scheduler.add(Sequence("early", [1, 2, 3], GREEDY))
    assert run_step(scheduler) == [("early", 3)]
    scheduler.add(Sequence("long", list(range(40)), GREEDY))
    assert run_step(scheduler) == [("early", 1), ("long", 9)]
    assert run_step(scheduler) == [("early", 1), ("long", 9)]  # the decode is never starved


def test_max_num_seqs_caps_the_running_set() -> None:
    scheduler = make_scheduler(num_blocks=32, budget=100, max_num_seqs=2)
    for i in range(3):
        scheduler.add(Sequence(f"r{i}", [1, 2], GREEDY))
    assert [rid for rid, _ in run_step(scheduler)] == ["r0", "r1"]
    assert len(scheduler.waiting) == 1


def test_preemption_frees_the_newest_sequence_and_requeues_it_first() -> None:
    scheduler = make_scheduler(num_blocks=4, budget=100)
    a = Sequence("a", [1, 2, 3, 4, 5, 6, 7], GREEDY)  # 2 blocks
    b = Sequence("b", [9, 9, 9, 9, 9, 9, 9], GREEDY)  # 2 blocks
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)  # both prefill 7 tokens (2 blocks each, pool full) and sample an 8th
    assert scheduler.kv.pool.num_free_blocks == 0
    assert run_step(scheduler) == [("a", 1), ("b", 1)]  # position 7 still fits in block 2
    batch = run_step(scheduler)  # a's position 8 needs a third block: b, the newest, is preempted
    assert batch == [("a", 1)]
    assert b.status is SequenceStatus.WAITING and scheduler.waiting[0] is b
    assert b.block_table == [] and b.num_computed_tokens == 0 and b.num_output_tokens == 2
    assert scheduler.num_preemptions_total == 1


def test_pool_too_small_for_all_requests_completes_each_like_alone() -> None:
    model = tiny_model()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (30, 45, 12, 60, 25, 38)]
    alone = [
        LLMEngine(
            model, EngineConfig(speculative_tokens=0, num_blocks=64, max_model_len=256), frozenset()
        ).generate([p], GREEDY)[0]
        for p in prompts
    ]
    engine = LLMEngine(
        model,
        EngineConfig(speculative_tokens=0, num_blocks=12, max_num_batched_tokens=64, max_model_len=192),
        frozenset(),
    )
    together = engine.generate(prompts, GREEDY)
    assert together == alone
    assert engine.scheduler.num_preemptions_total > 0
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert engine.stats().running == engine.stats().waiting == 0


@pytest.mark.parametrize("seed", [9, 14, 22])  # seeds whose workloads preempt and hit the prefix cache
def test_random_workloads_under_pressure_match_the_reference(seed: int) -> None:
    model = tiny_model()
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 256, (int(torch.randint(0, 40, (1,), generator=gen)),), generator=gen).tolist()
    prompts = [
        prefix
        + torch.randint(0, 256, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(6)
    ]
    config = EngineConfig(
        speculative_tokens=0,
        num_blocks=int(torch.randint(8, 14, (1,), generator=gen)),
        max_num_batched_tokens=int(torch.randint(8, 64, (1,), generator=gen)),
        max_num_seqs=int(torch.randint(2, 7, (1,), generator=gen)),
        max_model_len=128,
    )
    engine = LLMEngine(model, config, frozenset())
    spy = LogitsSpy(engine)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert all(len(o) == 16 for o in outs)
    assert engine.scheduler.num_preemptions_total > 0 and engine.stats().prefix_hit_tokens_total > 0
    assert_matches_reference(model, spy)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_a_verify_runs_its_drafts_without_putting_them_in_the_sequence() -> None:
    scheduler = make_scheduler(num_blocks=8, budget=16)
    seq = Sequence("s", [1, 2, 3], GREEDY)
    scheduler.add(seq)
    run_step(scheduler)  # prefill 3 and sample 7: [1, 2, 3, 7], 3 computed
    [item] = scheduler.schedule({seq: [5, 6, 8, 2]})
    assert item.draft == (5, 6, 8, 2) and item.num_new_tokens == 5 and item.samples
    assert item.input_ids == [7, 5, 6, 8, 2] and seq.token_ids == [1, 2, 3, 7]
    assert len(seq.block_table) == 2  # KV room for positions 3..7, the drafts' included
    # the verify accepts 5 and 6, rejects 8 and picks 9 in its place
    assert scheduler.postprocess([item], [[5, 6, 9]]) == [(seq, 5, None), (seq, 6, None), (seq, 9, None)]
    assert seq.token_ids == [1, 2, 3, 7, 5, 6, 9]
    assert seq.num_computed_tokens == 6  # KV of 7 and the accepted drafts; 9 is the next step's input
    pool = scheduler.kv.pool
    h0 = chain_hash(None, [1, 2, 3, 7])
    assert pool.num_cached_blocks == 1 and seq.block_hashes == [h0]  # block 1 held the rejected drafts
    assert run_step(scheduler) == [("s", 1)]  # a plain decode at position 6 (9), samples 7
    assert run_step(scheduler) == [("s", 1)]  # position 7 fills block 1 with real tokens
    h1 = chain_hash(h0, [5, 6, 9, 7])
    assert seq.block_hashes == [h0, h1] and pool.lookup(h1, [5, 6, 9, 7]) == seq.block_table[1]
    assert pool.lookup(chain_hash(h0, [5, 6, 8, 2]), [5, 6, 8, 2]) is None
    assert len(seq.block_table) == 2  # the block the rejected drafts wrote was reused: none leaked


def test_drafts_get_only_the_budget_every_decode_leaves() -> None:
    scheduler = make_scheduler(num_blocks=16, budget=4)
    a, b = Sequence("a", [1, 2], GREEDY), Sequence("b", [3, 4], GREEDY)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)  # both prefill and sample 7
    batch = scheduler.schedule({a: [5, 6, 8], b: [9]})
    # two decodes keep a token each; a's drafts take the 2 left, b verifies nothing
    assert [(i.seq, i.draft, i.num_new_tokens) for i in batch] == [(a, (5, 6), 3), (b, (), 1)]
    assert a.token_ids == [1, 2, 7] and b.token_ids == [3, 4, 7]
    scheduler.postprocess(batch, [[4], 2])  # a's first draft rejected: one token, as a plain decode
    assert a.token_ids == [1, 2, 7, 4] and a.num_computed_tokens == 3 and b.token_ids == [3, 4, 7, 2]


def test_a_finish_inside_the_accepted_drafts_drops_the_rest() -> None:
    scheduler = make_scheduler(num_blocks=8, budget=16)
    seq = Sequence("s", [1, 2, 3], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=(6,)))
    scheduler.add(seq)
    run_step(scheduler)
    [item] = scheduler.schedule({seq: [5, 6, 8, 2]})
    assert scheduler.postprocess([item], [[5, 6, 8, 9]]) == [(seq, 5, None), (seq, 6, "stop")]
    assert seq.token_ids == [1, 2, 3, 7, 5, 6] and seq.is_finished
    pool = scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks and pool.num_cached_blocks == 1  # [1, 2, 3, 7] alone
