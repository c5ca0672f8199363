"""Batch invariance (docs/design.md §8): a sequence's logits have the same bits alone, in any batch, with staggered
arrivals, under any prefill chunking, with its prefix from the cache, and after preemption and recompute. For the
dense eager layers (fp32, bf16) and for the int4 model, whose layers run as the native decoder step where
tokenedge's kernel runs (backend/model/native_step.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.engine.scheduler import ScheduledSeq
from backend.model.llama import LlamaModel
from harness.models.tiny import tiny_model, tiny_weights, unaligned_config
from tests.backend.test_quant import _quantized_tiny

TARGET = "target"
NEW_TOKENS = 12
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# the CPU models: the dense ones, and int4 (the GGUF's blocks, tests/backend/test_quant.py)
CPU_MODELS = [*sorted(DTYPES), "int4"]
_MODELS: dict[tuple[str, str], LlamaModel] = {}


def model_for(dtype: str, device: str = "cpu") -> LlamaModel:
    if (dtype, device) not in _MODELS:
        if dtype == "int4":
            model = _quantized_tiny(with_blocks=True)
            assert isinstance(model, LlamaModel)
            _MODELS[dtype, device] = model
        else:
            _MODELS[dtype, device] = tiny_model(seed=3, dtype=DTYPES[dtype], device=device)
    return _MODELS[dtype, device]


def rand_ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass
class Scenario:
    """Everything else the engine is doing while the target runs."""

    budget: int = 512  # max_num_batched_tokens: the prefill chunk size
    num_blocks: int = 128
    others: list[tuple[int, list[int]]] = field(default_factory=list)  # (arrival step, prompt)
    warm: list[int] | None = None  # a prompt run to completion first (fills the prefix cache)


def target_logits(model: LlamaModel, prompt: list[int], scenario: Scenario) -> dict[int, torch.Tensor]:
    """The target's logits row at each length it sampled at: {num_tokens: [vocab] fp32}."""
    config = EngineConfig(
        speculative_tokens=0,
        num_blocks=scenario.num_blocks,
        max_num_batched_tokens=scenario.budget,
        max_model_len=256,
        device=model.device.type,
    )
    engine = LLMEngine(model, config, frozenset())
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    if scenario.warm is not None:
        engine.generate([scenario.warm], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    rows: dict[int, torch.Tensor] = {}
    inner = engine.runner.compute_logits

    def spy(batch: list[ScheduledSeq]) -> torch.Tensor:
        logits = inner(batch)
        sampled = [item.seq for item in batch if item.samples]
        for seq, row in zip(sampled, logits, strict=True):
            if seq.request_id == TARGET:
                rows[seq.num_tokens] = row.clone()
        return logits

    engine.runner.compute_logits = spy  # type: ignore[method-assign]
    pending = sorted(scenario.others, key=lambda o: o[0])
    target = engine.add_request(TARGET, engine.prompt(prompt), params)
    step = 0
    while engine.has_unfinished() or pending:
        while pending and pending[0][0] <= step:
            _, other = pending.pop(0)
            engine.add_request(f"other-{step}-{len(pending)}", engine.prompt(other), params)
        engine.step()
        step += 1
    assert target.num_output_tokens == NEW_TOKENS
    return rows


def assert_bitwise(alone: dict[int, torch.Tensor], other: dict[int, torch.Tensor]) -> None:
    assert sorted(other) == sorted(alone)
    for length, row in alone.items():
        diff = (other[length] - row).abs().max().item()
        assert torch.equal(other[length], row), f"logits at length {length} differ by {diff}"


@pytest.mark.parametrize("dtype", CPU_MODELS)
def test_every_scenario_gives_the_logits_of_the_sequence_alone(dtype: str) -> None:
    model = model_for(dtype)
    prompt = rand_ids(40, seed=1)
    alone = target_logits(model, prompt, Scenario())
    for size in (2, 5, 16):  # all at once, batch sizes 2..16
        others = [(0, rand_ids(5 + 9 * i, seed=10 + i)) for i in range(size - 1)]
        assert_bitwise(alone, target_logits(model, prompt, Scenario(others=others)))
    staggered = [(step, rand_ids(3 + 7 * step, seed=30 + step)) for step in range(0, 14, 2)]
    assert_bitwise(alone, target_logits(model, prompt, Scenario(others=staggered)))
    for budget in (1, 7, 16, 33):  # chunked prefill at several budgets, with company
        others = [(1, rand_ids(20, seed=40))]
        assert_bitwise(alone, target_logits(model, prompt, Scenario(budget=budget, others=others)))


@pytest.mark.parametrize("dtype", CPU_MODELS)
def test_a_prefix_from_the_cache_gives_the_same_logits(dtype: str) -> None:
    model = model_for(dtype)
    for length in (33, 48, 49):  # 49: two full cached blocks leave a one-token remainder (query_len == 1)
        prompt = rand_ids(length, seed=2)
        alone = target_logits(model, prompt, Scenario())
        assert_bitwise(alone, target_logits(model, prompt, Scenario(warm=[*prompt[:32], 7, 7])))
        assert_bitwise(alone, target_logits(model, prompt, Scenario(warm=prompt)))


@pytest.mark.parametrize("dtype", CPU_MODELS)
def test_preemption_and_recompute_give_the_same_logits(dtype: str) -> None:
    model = model_for(dtype)
    prompt = rand_ids(30, seed=5)
    alone = target_logits(model, prompt, Scenario())
    others = [(0, rand_ids(40 + 5 * i, seed=50 + i)) for i in range(4)]
    scenario = Scenario(num_blocks=16, budget=64, others=others)  # 5 x ~50 tokens in 16 blocks of 16
    config = EngineConfig(speculative_tokens=0, num_blocks=16, max_num_batched_tokens=64, max_model_len=256)
    engine = LLMEngine(model, config, frozenset())
    engine.generate([prompt] + [p for _, p in others], SamplingParams(temperature=0, max_tokens=NEW_TOKENS))
    assert engine.scheduler.num_preemptions_total > 0  # the scenario really preempts
    assert_bitwise(alone, target_logits(model, prompt, scenario))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_rows_off_64_byte_boundaries_give_the_logits_of_the_sequence_alone(dtype: str) -> None:
    """Widths whose rows are no 16-byte multiples in fp32 (harness/models/tiny.py): MKL's sgemm, in the linears
    and inside SDPA, sums such rows differently by their address on some CPUs (an AMD EPYC)."""
    torch.set_num_threads(1)
    config = unaligned_config()
    model = LlamaModel(config, dtype=DTYPES[dtype])
    model.load_weights(tiny_weights(config, seed=4))
    prompt = rand_ids(41, seed=8)
    alone = target_logits(model, prompt, Scenario())
    others = [(i, rand_ids(5 + 8 * i, seed=80 + i)) for i in range(5)]
    assert_bitwise(alone, target_logits(model, prompt, Scenario(others=others)))
    assert_bitwise(alone, target_logits(model, prompt, Scenario(budget=7, others=others[:2])))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(CPU_MODELS),
    prompt_len=st.integers(1, 70),
    budget=st.sampled_from([1, 3, 16, 17, 40, 512]),
    others=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 60)), max_size=15),
    warm_len=st.one_of(st.none(), st.integers(16, 70)),
    small_pool=st.booleans(),
)
# found by this test: bf16 o_proj rows at M = 1 (a GEMV) and M = 2 round differently, for few inputs
@example(dtype="bf16", prompt_len=55, budget=3, others=[(0, 1)], warm_len=None, small_pool=False)
def test_drawn_scenarios_give_the_logits_of_the_sequence_alone(
    dtype: str,
    prompt_len: int,
    budget: int,
    others: list[tuple[int, int]],
    warm_len: int | None,
    small_pool: bool,
) -> None:
    model = model_for(dtype)
    prompt = rand_ids(prompt_len, seed=prompt_len)
    alone = target_logits(model, prompt, Scenario())
    warm = None if warm_len is None else (prompt + rand_ids(70, seed=9))[:warm_len]
    scenario = Scenario(
        budget=budget,
        num_blocks=16 if small_pool else 128,
        others=[(step, rand_ids(n, seed=100 + i)) for i, (step, n) in enumerate(others)],
        warm=warm,
    )
    assert_bitwise(alone, target_logits(model, prompt, scenario))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_cuda_scenarios_give_the_logits_of_the_sequence_alone(dtype: str) -> None:
    model = model_for(dtype, "cuda")
    prompt = rand_ids(45, seed=7)
    alone = target_logits(model, prompt, Scenario())
    others = [(i, rand_ids(4 + 9 * i, seed=70 + i)) for i in range(15)]
    assert_bitwise(alone, target_logits(model, prompt, Scenario(others=others)))
    assert_bitwise(alone, target_logits(model, prompt, Scenario(budget=7, others=others[:3])))
    assert_bitwise(alone, target_logits(model, prompt, Scenario(warm=prompt[:33])))
    assert_bitwise(
        alone, target_logits(model, prompt, Scenario(num_blocks=16, budget=64, others=others[5:9]))
    )


_AVX2_CHILD = """
import torch
from tests.backend.test_batch_invariance import Scenario, assert_bitwise, model_for, rand_ids, target_logits
for dtype in ("bf16", "fp32"):
    model = model_for(dtype)
    prompt = rand_ids(37, seed=1)
    alone = target_logits(model, prompt, Scenario())
    others = [(i, rand_ids(9 + 11 * i, seed=60 + i)) for i in range(6)]
    assert_bitwise(alone, target_logits(model, prompt, Scenario(budget=16, others=others)))
    print(dtype, model.tilings)
"""


def test_invariance_holds_without_amx_or_avx512() -> None:
    """oneDNN, MKL and ATen limited to AVX2, as on CPUs without AMX: the calibration finds other tiles,
    the property stays."""
    env = {
        **os.environ,
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
    }
    done = subprocess.run(
        [sys.executable, "-c", _AVX2_CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("RowTiling") >= 10, done.stdout
