"""LLMEngine: prefix reuse accounting, seeded sampling independent of the batch, finish reasons, aborts."""

from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.errors import InvalidRequestError
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from harness.models.tiny import tiny_model


def make_engine(**overrides: int) -> LLMEngine:
    config = EngineConfig(
        speculative_tokens=0,
        **{"num_blocks": 64, "max_num_batched_tokens": 128, "max_model_len": 256, **overrides},
    )
    return LLMEngine(tiny_model(), config, eos_token_ids=frozenset({0}))


def random_prompt(n: int, seed: int) -> list[int]:
    # token 0 is EOS in these tests: keep it out of prompts
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_second_request_with_a_shared_prefix_prefills_fewer_tokens() -> None:
    engine = make_engine()
    system = random_prompt(80, seed=1)  # five full blocks
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    first = engine.add_request("a", engine.prompt(system + random_prompt(6, seed=2)), params)
    while engine.has_unfinished():
        engine.step()
    prefill_first = engine.stats().prefill_tokens_total
    second = engine.add_request("b", engine.prompt(system + random_prompt(6, seed=3)), params)
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats()
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 80
    assert stats.prefix_hit_tokens_total == 80
    assert stats.prefill_tokens_total - prefill_first == 6
    assert prefill_first == 86


def test_next_turn_reuses_the_blocks_of_the_previous_turn_including_its_answer() -> None:
    engine = make_engine()
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    turn1 = random_prompt(20, seed=4)
    (answer,) = engine.generate([turn1], params)
    engine.generate([turn1 + answer + random_prompt(5, seed=5)], params)
    # 20 + 30 tokens: the first 49 have KV (the last sampled token was never fed back) -> 3 full blocks, and
    # the 49th from the block the first turn left partly filled (token-granular reuse)
    assert engine.stats().prefix_hit_tokens_total == 49


def test_seeded_sampling_is_the_same_alone_and_in_a_batch() -> None:
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=20, seed=1234, ignore_eos=True)
    prompt = random_prompt(10, seed=6)
    (alone,) = make_engine().generate([prompt], params)
    others = SamplingParams(temperature=0.8, max_tokens=25, ignore_eos=True)
    batch = make_engine().generate(
        [random_prompt(30, seed=7), prompt, random_prompt(3, seed=8)], [others, params, others]
    )
    assert batch[1] == alone
    (other_seed,) = make_engine().generate([prompt], SamplingParams(**{**_fields(params), "seed": 99}))
    assert other_seed != alone


def _fields(params: SamplingParams) -> dict[str, object]:
    return {name: getattr(params, name) for name in SamplingParams.__slots__}


def test_finish_reasons_stop_token_eos_and_length() -> None:
    engine = make_engine()
    prompt = random_prompt(12, seed=9)
    (free_run,) = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    stop_at = free_run[3]
    first_stop = free_run.index(stop_at)
    seq = engine.add_request(
        "s",
        engine.prompt(prompt),
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=frozenset({stop_at})),
    )
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.token.token_id for o in outs] == free_run[: first_stop + 1]
    assert outs[-1].token.finish_reason == "stop" and all(o.token.finish_reason is None for o in outs[:-1])
    assert seq.finish_reason == "stop"
    eos_engine = LLMEngine(engine.model, engine.config, eos_token_ids=frozenset({stop_at}))
    (until_eos,) = eos_engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8))
    assert until_eos == free_run[: first_stop + 1]
    length = engine.add_request(
        "l", engine.prompt(prompt), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )
    while engine.has_unfinished():
        engine.step()
    assert length.finish_reason == "length" and length.num_output_tokens == 5


def test_generation_stops_at_max_model_len() -> None:
    engine = make_engine(max_model_len=40, num_blocks=8)
    (out,) = engine.generate(
        [random_prompt(30, seed=10)], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    )
    assert len(out) == 10


def test_abort_frees_blocks_of_running_and_waiting_requests() -> None:
    engine = make_engine(max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    engine.add_request("run", engine.prompt(random_prompt(40, seed=11)), params)
    engine.add_request("wait", engine.prompt(random_prompt(40, seed=12)), params)
    engine.step()
    assert engine.stats().running == 1 and engine.stats().waiting == 1
    assert engine.abort_request("run") and engine.abort_request("wait")
    assert not engine.abort_request("run")
    assert not engine.has_unfinished()
    assert engine.stats().blocks_free == engine.stats().blocks_total


@pytest.mark.parametrize("prompt", [[], list(range(1, 300)), [1, 2, 256]])
def test_invalid_prompts_are_rejected(prompt: list[int]) -> None:
    with pytest.raises(InvalidRequestError):
        make_engine().prompt(prompt)
