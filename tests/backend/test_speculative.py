"""Prompt-lookup speculation: drafting and acceptance rules, engine output bitwise equal to plain greedy
decoding whatever the batch (copy-heavy prompts so that drafts are really accepted), and drafts that never enter
a sequence's tokens."""

from __future__ import annotations

import itertools

import pytest
import torch

from backend.engine.block_pool import chain_hash
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import TokenOut
from backend.engine.sampling import SamplingParams
from backend.engine.scheduler import ScheduledSeq
from backend.engine.sequence import Sequence
from backend.engine.speculative import ProbeYield, SpeculativeConfig, accept, propose
from backend.model.llama import LlamaModel
from harness.models.tiny import tiny_model


@pytest.mark.parametrize(
    ("tokens", "k", "expected"),
    [
        ([1, 2, 3, 4, 5, 1, 2, 3], 3, [4, 5, 1]),  # trigram match, up to k tokens follow
        ([1, 2, 3, 4, 5, 1, 2, 3], 1, [4]),
        ([9, 2, 3, 7, 8, 2, 3, 6, 6, 2, 3], 2, [6, 6]),  # the latest earlier match wins
        ([1, 2, 3, 4], 3, []),  # no repeated n-gram
        ([5, 6, 7, 5, 6], 4, [7, 5, 6]),  # bigram fallback; fewer than k follow
        ([4, 4, 4, 4], 2, [4]),  # the match may overlap the suffix
    ],
)
def test_propose_continues_the_latest_earlier_ngram(tokens: list[int], k: int, expected: list[int]) -> None:
    assert propose(tokens, k, max_ngram=3, min_ngram=2) == expected


@pytest.mark.parametrize(
    ("drafts", "picks", "expected"),
    [
        ([4, 5, 6], [4, 5, 6, 7], [4, 5, 6, 7]),  # all accepted, plus the bonus token
        ([4, 5, 6], [4, 9, 6, 7], [4, 9]),  # stop at the first mismatch, keep its pick
        ([4, 5, 6], [8, 5, 6, 7], [8]),  # nothing accepted: one token, as a plain step
    ],
)
def test_accept_keeps_drafts_up_to_the_first_mismatch(
    drafts: list[int], picks: list[int], expected: list[int]
) -> None:
    assert accept(drafts, picks) == expected


def test_speculative_config_is_validated() -> None:
    with pytest.raises(ValueError):
        SpeculativeConfig(num_tokens=-1)
    with pytest.raises(ValueError):
        SpeculativeConfig(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError):
        EngineConfig(speculative_tokens=-2)
    assert EngineConfig(speculative_tokens=4).draft_tokens == 4
    # exact only on batch-invariant kernels: off without them, whatever speculative_tokens says
    assert EngineConfig(speculative_tokens=4, batch_invariant=False).draft_tokens == 0


def copy_prompts() -> list[list[int]]:
    """Prompts that repeat themselves, so the (tiny, random) model's continuation often repeats too."""
    base = [[(5 * i + 3 * j) % 97 + 1 for j in range(11 + i)] for i in range(4)]
    return [b * 3 for b in base] + [[7, 8, 9] * 6 + [1, 2]]


def run(
    model: LlamaModel, k: int, prompts: list[list[int]], params: list[SamplingParams]
) -> tuple[list[list[int]], LLMEngine]:
    config = EngineConfig(
        num_blocks=96, max_num_seqs=8, max_num_batched_tokens=24, max_model_len=256, speculative_tokens=k
    )
    engine = LLMEngine(model, config, frozenset({0}))
    return engine.generate(prompts, params), engine


@pytest.mark.parametrize("k", [1, 4])
def test_speculative_greedy_output_equals_plain_greedy(k: int) -> None:
    model = tiny_model()
    prompts = copy_prompts()
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * len(prompts)
    plain, _ = run(model, 0, prompts, params)
    spec, engine = run(model, k, prompts, params)
    assert spec == plain
    stats = engine.stats()
    assert stats.spec_verify_steps_total > 0 and stats.spec_accepted_tokens_total > 0
    assert stats.generated_tokens_total == sum(len(out) for out in plain)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks  # drafts leaked no block


def test_speculation_beside_sampled_requests_and_stops() -> None:
    model = tiny_model()
    prompts = copy_prompts()
    params = [
        SamplingParams(temperature=0, max_tokens=33),  # EOS (0) may stop it mid-draft
        SamplingParams(temperature=0.8, seed=5, max_tokens=20),  # sampled: never drafts
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),  # max_tokens inside a verify
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=(9,)),
        SamplingParams(temperature=0, max_tokens=25, ignore_eos=True),
    ]
    plain, _ = run(model, 0, prompts, params)
    spec, engine = run(model, 4, prompts, params)
    assert spec == plain
    assert [len(out) for out in spec][2] == 7
    assert engine.stats().spec_verify_steps_total > 0


def test_speculation_on_a_bf16_model_equals_plain_greedy() -> None:
    model = tiny_model(dtype=torch.bfloat16)
    prompts = copy_prompts()
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)] * len(prompts)
    assert run(model, 3, prompts, params)[0] == run(model, 0, prompts, params)[0]


def staggered(model: LlamaModel, k: int) -> list[list[int]]:
    """A copy-heavy decode that is already running when long prompts arrive and prefill in small chunks."""
    config = EngineConfig(
        num_blocks=96, max_num_seqs=4, max_num_batched_tokens=10, max_model_len=256, speculative_tokens=k
    )
    engine = LLMEngine(model, config, frozenset())
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    first = engine.add_request("a", engine.prompt(copy_prompts()[0]), params)
    while first.num_output_tokens < 3:
        engine.step()
    later = [
        engine.add_request(f"b{i}", engine.prompt([(11 * j + i) % 90 + 2 for j in range(40)] * 2), params)
        for i in range(2)
    ]
    while engine.has_unfinished():
        engine.step()
    return [s.output_token_ids for s in (first, *later)]


def test_a_verify_is_never_cut_by_a_chunked_prefill_sharing_the_budget() -> None:
    model = tiny_model()
    assert staggered(model, 4) == staggered(model, 0)


def test_a_request_whose_drafts_keep_failing_stops_drafting() -> None:
    config = EngineConfig(num_blocks=32, max_num_seqs=2, max_model_len=128, speculative_tokens=4)
    engine = LLMEngine(tiny_model(), config, frozenset())
    seq = engine.add_request(
        "r", engine.prompt([1, 2, 3, 1, 2, 3]), SamplingParams(temperature=0, max_tokens=8)
    )
    assert engine._drafts_pay(seq)  # nothing drafted yet: probe
    engine._spec_tally["r"] = (16, 4)  # 25% accepted after the probe
    assert not engine._drafts_pay(seq)
    engine._spec_tally["r"] = (16, 5)
    assert engine._drafts_pay(seq)
    engine.abort_request("r")
    assert "r" not in engine._spec_tally


def test_drafts_must_beat_the_measured_cost_of_a_row() -> None:
    """Where a row costs half a step (the AVX2 build, one thread) a verify that keeps 40% of its drafts loses time:
    after the probe the request stops drafting; where a row costs a whole step, it does not even probe."""
    config = EngineConfig(num_blocks=32, max_num_seqs=2, max_model_len=128, speculative_tokens=4)
    engine = LLMEngine(tiny_model(), config, frozenset())
    seq = engine.add_request(
        "r", engine.prompt([1, 2, 3, 1, 2, 3]), SamplingParams(temperature=0, max_tokens=8)
    )
    engine.row_cost.record(1, 0.010)
    engine.row_cost.record(5, 0.030)  # 4 more rows, 20 ms: each row half a one-row step
    assert engine.row_cost.marginal == pytest.approx(0.5)
    assert engine._drafts_pay(seq)  # the probe
    engine._spec_tally["r"] = (16, 7)  # 44% accepted: above the 0.3 floor, below the break-even 0.5
    assert not engine._drafts_pay(seq)
    engine._spec_tally["r"] = (16, 9)
    assert engine._drafts_pay(seq)
    engine._spec_tally["r"] = (0, 0)
    for _ in range(30):
        engine.row_cost.record(3, 0.035)  # a row now costs more than a one-row step
    assert engine.row_cost.marginal is not None and engine.row_cost.marginal > 1.0
    assert not engine._drafts_pay(seq)  # no probe: no acceptance could pay


def test_requests_stop_probing_where_drafting_never_pays_and_every_eighth_explores() -> None:
    """Free-text traffic: once finished requests' drafts did not pay, a new request does not probe, except every
    8th; when an exploring request's drafts pay (copy-heavy traffic is back), every request probes again."""
    config = EngineConfig(num_blocks=64, max_num_seqs=4, max_model_len=128, speculative_tokens=4)
    engine = LLMEngine(tiny_model(), config, frozenset())
    count = itertools.count()

    def new_request() -> tuple[str, bool]:
        rid = f"r{next(count)}"
        seq = engine.add_request(
            rid, engine.prompt([1, 2, 3, 1, 2, 3]), SamplingParams(temperature=0, max_tokens=8)
        )
        return rid, engine._drafts_pay(seq)

    rid, probes = new_request()
    assert probes  # nothing known yet: it probes
    engine._spec_tally[rid] = (16, 1)  # its drafts did not pay
    engine.abort_request(rid)
    asked = []
    for _ in range(16):
        rid, probes = new_request()
        asked.append(probes)
        engine.abort_request(rid)  # drafted nothing: nothing learnt
    assert asked.count(True) == 2 and asked[6] and asked[14]  # the 8th and 16th requests asked
    while not (explorer := new_request())[1]:
        engine.abort_request(explorer[0])
    engine._spec_tally[explorer[0]] = (16, 12)  # 75% accepted: its drafts paid
    engine.abort_request(explorer[0])
    assert all(new_request()[1] for _ in range(4))


def test_probe_yield_learns_how_often_drafting_pays() -> None:
    pays = ProbeYield()
    assert pays.probes()
    pays.record(0, 0, 0.5)  # drafted nothing: no evidence
    assert pays.rate is None
    pays.record(10, 4, 0.5)
    assert pays.rate == 0.0
    pays.record(10, 5, 0.5)  # exactly break-even pays
    assert pays.rate == pytest.approx(0.2)


def test_the_engine_times_its_decode_steps_for_the_row_cost() -> None:
    config = EngineConfig(num_blocks=32, max_num_seqs=4, max_model_len=128, speculative_tokens=3)
    engine = LLMEngine(tiny_model(), config, frozenset())
    params = SamplingParams(temperature=0, max_tokens=6)
    engine.add_request("alone", engine.prompt([5, 9, 2, 7]), params)
    for _ in range(3):  # its prefill, then one-row decodes
        engine.step()
    assert engine.row_cost.one_row_s is not None
    for i in range(2):
        engine.add_request(f"r{i}", engine.prompt([4, 8, 6]), params)
    while engine.has_unfinished():
        engine.step()
    assert engine.row_cost.marginal is not None  # decodes together: wider steps were timed


def assert_hashes_cover(seq: Sequence, block_size: int) -> None:
    """The sequence's memoised block hashes are the chain over its own tokens, full blocks only."""
    prev: int | None = None
    for i, block_hash in enumerate(seq.block_hashes):
        assert (i + 1) * block_size <= seq.num_tokens
        prev = chain_hash(prev, seq.token_ids[i * block_size : (i + 1) * block_size])
        assert block_hash == prev


def test_no_sequence_holds_a_draft_while_its_verify_runs() -> None:
    """While the model runs a step, every sequence's token_ids is its prompt and the tokens the engine handed
    out so far (the drafts ride on the step), and its block hashes cover those tokens alone."""
    config = EngineConfig(
        num_blocks=96, block_size=4, max_num_batched_tokens=24, max_model_len=256, speculative_tokens=4
    )
    engine = LLMEngine(tiny_model(), config, frozenset({0}))
    real: dict[str, list[int]] = {}
    drafts: list[tuple[int, ...]] = []
    inner = engine.runner.run

    def run(batch: list[ScheduledSeq]) -> list[int | list[int] | None]:
        for item in batch:
            assert item.seq.token_ids == real[item.seq.request_id]
            assert_hashes_cover(item.seq, config.block_size)
        drafts.extend(item.draft for item in batch if item.draft)
        return inner(batch)

    engine.runner.run = run  # type: ignore[method-assign]
    params = SamplingParams(temperature=0, max_tokens=30)
    seqs = [engine.add_request(f"r{i}", engine.prompt(p), params) for i, p in enumerate(copy_prompts())]
    real.update((s.request_id, list(s.token_ids)) for s in seqs)
    while engine.has_unfinished():
        for out in engine.step():
            assert isinstance(out.token, TokenOut)
            real[out.request_id].append(out.token.token_id)
    assert drafts and all(s.token_ids == real[s.request_id] for s in seqs)  # each token appended once
    stats = engine.stats()  # some drafts were rejected, and none of them shows in a sequence
    assert stats.spec_draft_tokens_total == sum(map(len, drafts)) > stats.spec_accepted_tokens_total
