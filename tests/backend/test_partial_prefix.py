"""Token-granular prefix reuse (backend/engine/kv_cache_manager.py): where a prompt's next full block misses the
prefix cache, the cached block that followed the same chain and shares the longest run of leading tokens lends
the KV rows of those tokens, copied into the sequence's own block. The reused count is reported, and the
logits keep their bits (docs/design.md §8): a prefix from the cache, whole blocks or part of one, changes nothing."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import pytest
import torch

from backend.engine.block_pool import PARTIAL_CANDIDATES, BlockPool, chain_hash
from backend.engine.config import EngineConfig
from backend.engine.kv_cache_manager import KVCacheManager
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence
from backend.model.llama import LlamaModel
from harness.logits_spy import LogitsSpy
from tests.backend.test_batch_invariance import CPU_MODELS, model_for, rand_ids

NEW_TOKENS = 12
SHARED = rand_ids(29, seed=1)  # a chat template's preamble: one full block of 16, then 13 tokens of the next


def chat(tail_seed: int) -> list[int]:
    """A 52-token prompt: the shared preamble, then a question of its own."""
    return SHARED + rand_ids(23, seed=tail_seed)


@dataclass
class Run:
    tokens: list[int]
    logits: dict[int, torch.Tensor]  # {the target's token count when it sampled: that row's logits}
    cached: int  # the target's num_cached_tokens (the usage's cached_tokens)
    counted: int  # what the target added to the engine's prefix-hit counter (the /metrics counter)


def run_target(
    model: LlamaModel, prompt: list[int], earlier: Seq[list[int]] = (), salt: str = "", earlier_salt: str = ""
) -> Run:
    """The target run greedy on a fresh engine after the `earlier` prompts ran to completion, one by one."""
    config = EngineConfig(speculative_tokens=0, num_blocks=64, max_num_batched_tokens=512, max_model_len=256)
    engine = LLMEngine(model, config, frozenset())
    for p in earlier:
        engine.generate(
            [p], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, cache_salt=earlier_salt)
        )
    spy = LogitsSpy(engine)
    before = engine.stats().prefix_hit_tokens_total
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, cache_salt=salt)
    seq = engine.add_request("target", engine.prompt(prompt), params)
    while engine.has_unfinished():
        engine.step()
    rows = {n: row for s, n, row in spy.rows if s is seq}
    counted = engine.stats().prefix_hit_tokens_total - before
    return Run(seq.output_token_ids, rows, seq.num_cached_tokens, counted)


def assert_same(fresh: Run, other: Run) -> None:
    assert other.tokens == fresh.tokens
    assert sorted(other.logits) == sorted(fresh.logits) and len(fresh.logits) == NEW_TOKENS
    for length, row in fresh.logits.items():
        diff = (other.logits[length] - row).abs().max().item()
        assert torch.equal(other.logits[length], row), f"logits at length {length} differ by {diff}"


@pytest.mark.parametrize("dtype", CPU_MODELS)
def test_a_prefix_shared_past_a_block_boundary_is_reused_token_by_token_and_exact(dtype: str) -> None:
    model = model_for(dtype)
    earlier, prompt = chat(2), chat(3)
    assert earlier[29] != prompt[29]  # the questions differ from their first token
    fresh = run_target(model, prompt)
    warm = run_target(model, prompt, earlier=[earlier])
    # the earlier prompt's second block is full of other tokens, but its first 13 are the preamble's tail
    assert fresh.cached == 0 and warm.cached == warm.counted == 29
    assert_same(fresh, warm)


@pytest.mark.parametrize("dtype", CPU_MODELS)
def test_the_block_a_finished_turn_left_partly_filled_is_reused(dtype: str) -> None:
    model = model_for(dtype)
    turn1 = rand_ids(20, seed=4)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    (answer,) = run_engine_once(model, turn1, params)
    prompt = turn1 + answer + rand_ids(6, seed=5)
    warm = run_target(model, prompt, earlier=[turn1])
    # turn 1 computed 22 tokens (its last answer token was never fed back): a full block and 6 rows of the next
    assert warm.cached == warm.counted == 22
    assert_same(run_target(model, prompt), warm)


def run_engine_once(model: LlamaModel, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    config = EngineConfig(speculative_tokens=0, num_blocks=64, max_num_batched_tokens=512, max_model_len=256)
    return LLMEngine(model, config, frozenset()).generate([prompt], params)


def test_a_partial_match_never_crosses_a_salt() -> None:
    model = model_for("fp32")
    short = SHARED[:10]  # shared inside the first block: the match hangs on the salt's root alone
    cases = [(chat(2), chat(3), 29), (short + rand_ids(20, seed=6), short + rand_ids(20, seed=7), 10)]
    for earlier, prompt, shared in cases:
        assert run_target(model, prompt, [earlier], salt="a", earlier_salt="a").cached == shared
        assert run_target(model, prompt, [earlier], salt="b", earlier_salt="a").cached == 0
        assert run_target(model, prompt, [earlier], salt="", earlier_salt="a").cached == 0
        assert run_target(model, prompt, [earlier], salt="a", earlier_salt="").cached == 0


def test_mutation_a_row_short_copy_changes_the_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the bitwise check guards: a copy one row short leaves a stale key and value in the block."""
    model = model_for("fp32")
    copy_rows = BlockPool.copy_rows
    monkeypatch.setattr(BlockPool, "copy_rows", lambda self, src, dst, n: copy_rows(self, src, dst, n - 1))
    fresh = run_target(model, chat(3))
    warm = run_target(model, chat(3), earlier=[chat(2)])
    assert warm.cached == 29
    assert any(not torch.equal(row, warm.logits[n]) for n, row in fresh.logits.items())


# ---- the manager alone: which block lends its rows, how many, and where they go -------------------------


def manager(num_blocks: int = 8) -> KVCacheManager:
    pool = BlockPool(
        num_blocks, 4, num_layers=2, num_kv_heads=2, head_dim=3, dtype=torch.float32, device="cpu"
    )
    return KVCacheManager(pool)


def computed(kv: KVCacheManager, prompt: list[int]) -> Sequence:
    """A sequence whose whole prompt was computed (random KV rows written), registered, then freed."""
    seq = Sequence(f"s{prompt}", prompt, SamplingParams())
    assert kv.allocate(seq, len(prompt))
    for block in seq.block_table:
        for cache in (*kv.pool.k_caches, *kv.pool.v_caches):
            cache[block] = torch.rand(cache[block].shape)
    seq.num_computed_tokens = len(prompt)
    kv.cache_full_blocks(seq, 0)
    kv.free(seq)
    return seq


def test_the_longest_candidate_lends_exactly_its_shared_rows_to_a_fresh_block() -> None:
    kv = manager()
    for tail in ([5, 6, 9, 9], [5, 6, 7, 9], [5, 9, 9, 9]):  # three second blocks after the same first
        computed(kv, [1, 2, 3, 4, *tail])
    seq = Sequence("t", [1, 2, 3, 4, 5, 6, 7, 8, 10], SamplingParams())
    hit = kv.match_prefix(seq)
    assert (len(hit.blocks), hit.partial_tokens, hit.num_tokens) == (1, 3, 7)
    longest = chain_hash(chain_hash(None, [1, 2, 3, 4]), [5, 6, 7, 9])
    assert hit.partial == kv.pool.lookup(longest, [5, 6, 7, 9])  # [5, 6, 7] of [5, 6, 7, 9]
    assert kv.allocate(seq, 2, hit) and seq.num_computed_tokens == 7
    dst, src = seq.block_table[1], hit.partial
    assert dst != src
    for cache in (*kv.pool.k_caches, *kv.pool.v_caches):  # every layer, K and V: rows 0-2, not row 3
        assert torch.equal(cache[dst, :3], cache[src, :3]) and not torch.equal(cache[dst, 3], cache[src, 3])


def test_the_last_token_is_always_left_to_compute() -> None:
    kv = manager()
    computed(kv, [1, 2, 3, 4, 5, 6, 7, 9])
    same = kv.match_prefix(Sequence("same", [1, 2, 3, 4, 5, 6, 7, 9], SamplingParams()))
    assert (len(same.blocks), same.partial_tokens) == (1, 3)  # the cached full block lends 3 of its 4 rows
    shorter = kv.match_prefix(Sequence("shorter", [1, 2, 3, 4, 5, 6, 7], SamplingParams()))
    assert shorter.num_tokens == 6


def test_a_pool_too_tight_to_hold_the_source_computes_those_rows() -> None:
    kv = manager(num_blocks=3)
    computed(kv, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])  # three full blocks, all cached, none empty
    seq = Sequence("t", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 99], SamplingParams())
    hit = kv.match_prefix(seq)
    assert hit.num_tokens == 10  # two blocks and [9, 10] of the third, which is the only block to evict
    assert kv.allocate(seq, 1, hit)
    assert seq.num_computed_tokens == 8 and len(seq.block_table) == 3


def test_the_source_is_held_while_the_new_blocks_evict_others() -> None:
    kv = manager(num_blocks=4)
    computed(
        kv, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    )  # freed tail first: its third block is the LRU's oldest
    computed(kv, [20, 21, 22, 23])  # takes the empty block, freed after: evicted next
    other = kv.pool.lookup(chain_hash(None, [20, 21, 22, 23]), [20, 21, 22, 23])
    seq = Sequence("t", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 99], SamplingParams())
    hit = kv.match_prefix(seq)
    assert kv.allocate(seq, 1, hit) and seq.num_computed_tokens == 10
    assert seq.block_table[2] == other  # the other cached block was evicted, not the source
    assert kv.match_prefix(Sequence("again", seq.token_ids, SamplingParams())).partial == hit.partial


def test_a_parent_keeps_only_its_most_recent_candidates() -> None:
    kv = manager(num_blocks=12)
    for first in range(10, 10 + PARTIAL_CANDIDATES + 1):  # one partly filled first block each, same root
        computed(kv, [first, 1, 2])
    oldest, newest = (Sequence(str(k), [k, 1, 2, 5], SamplingParams()) for k in (10, 10 + PARTIAL_CANDIDATES))
    assert kv.match_prefix(oldest).num_tokens == 0 and kv.match_prefix(newest).num_tokens == 3
    assert kv.pool.num_free_blocks == 12
