"""The attention choice (backend/attention/selector.py) as a table over machine facts, so the CUDA rules (flash-attn's
sm80 floor, its block size, Triton as the batch-invariant default) are checked on a CPU; then the engine end to end
on the Triton backend under Triton's interpreter against the full-recompute reference."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = (
    "1"  # before triton is first imported: the engine test runs the kernel on CPU
)

import pytest
import torch

from backend.attention.selector import (
    AttentionName,
    Machine,
    choose_attention,
    machine,
    make_attention_backend,
    resolve_attention,
)
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from harness.logits_spy import LogitsSpy, assert_matches_reference
from harness.models.tiny import tiny_model
from tests.backend.test_paged_equivalence import prompts

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
H100 = Machine("cuda", (9, 0), flash_attn=True, triton=True)
A100_NO_FLASH = Machine("cuda", (8, 0), flash_attn=False, triton=True)
T4 = Machine("cuda", (7, 5), flash_attn=True, triton=True)  # flash-attn installed, but it refuses Turing
V100 = Machine("cuda", (7, 0), flash_attn=False, triton=True)
CUDA_BARE = Machine("cuda", (9, 0), flash_attn=False, triton=False)
CPU = Machine("cpu", None, flash_attn=False, triton=False)
CPU_INTERPRETED = Machine("cpu", None, flash_attn=False, triton=True)

# (requested, machine, dtype, block size, batch_invariant) -> the family built
CHOICES = [
    ("auto", H100, BF16, 16, True, "triton"),  # the GPU default: invariant and flash-style
    ("auto", H100, BF16, 256, True, "triton"),  # flash-attn's decode splits by batch: never in invariant mode
    ("auto", H100, BF16, 256, False, "flash"),
    ("auto", H100, BF16, 16, False, "triton"),  # flash-attn's paged kernels need 256-token blocks
    ("auto", H100, FP32, 256, False, "triton"),  # flash-attn is fp16/bf16 only
    ("auto", T4, FP16, 256, False, "triton"),  # flash-attn 2 refuses pre-Ampere cards
    ("auto", T4, BF16, 16, True, "sdpa"),  # Triton's bf16 dot needs sm80
    ("auto", A100_NO_FLASH, BF16, 256, False, "triton"),
    ("auto", V100, FP16, 16, True, "sdpa"),
    ("auto", CUDA_BARE, BF16, 16, True, "sdpa"),
    ("auto", CPU, FP32, 16, True, "sdpa"),
    ("auto", CPU_INTERPRETED, FP32, 16, True, "sdpa"),  # the interpreter is for tests, never chosen by auto
    ("sdpa", H100, BF16, 256, False, "sdpa"),
    ("flash", H100, BF16, 256, False, "flash"),
    ("triton", H100, BF16, 16, True, "triton"),
    ("triton", CPU_INTERPRETED, BF16, 7, True, "triton"),
]
REFUSED = [
    ("flash", H100, BF16, 256, True, "not batch-invariant"),
    ("flash", H100, BF16, 16, False, "multiple of 256"),
    ("flash", T4, FP16, 256, False, "compute capability"),
    ("flash", A100_NO_FLASH, BF16, 256, False, "flash-attn package"),
    ("flash", CPU, BF16, 256, False, "CUDA device"),
    ("triton", CPU, FP32, 16, True, "TRITON_INTERPRET"),
    ("triton", T4, BF16, 16, False, "compute capability"),
]


@pytest.mark.parametrize("requested, m, dtype, block_size, invariant, expected", CHOICES)
def test_the_choice(
    requested: AttentionName, m: Machine, dtype: torch.dtype, block_size: int, invariant: bool, expected: str
) -> None:
    assert choose_attention(requested, m, dtype, block_size, invariant) == expected


@pytest.mark.parametrize("requested, m, dtype, block_size, invariant, reason", REFUSED)
def test_a_backend_that_cannot_run_is_refused_with_the_reason(
    requested: AttentionName, m: Machine, dtype: torch.dtype, block_size: int, invariant: bool, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        choose_attention(requested, m, dtype, block_size, invariant)


def test_the_cpu_s_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert machine("cpu") == CPU
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert machine("cpu") == CPU_INTERPRETED


@pytest.mark.parametrize("requested", ["auto", "sdpa", "triton"])
@pytest.mark.parametrize("invariant", [True, False])
def test_the_reported_family_is_the_backend_built(requested: AttentionName, invariant: bool) -> None:
    """What `python -m backend` reports (resolve_attention) names the backend the engine runs."""
    reported = resolve_attention(requested, "cpu", FP32, 16, batch_invariant=invariant)
    built = make_attention_backend(
        requested, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, device="cpu", dtype=FP32,
        batch_invariant=invariant,
    )  # fmt: skip
    assert built.name.split("-")[0] == reported
    assert built.name == {"auto": "sdpa", "sdpa": "sdpa", "triton": "triton"}[requested] + (
        "-invariant" if invariant and requested != "triton" else ""
    )


def test_the_engine_on_the_triton_backend_matches_the_full_recompute_reference() -> None:
    """Prefill chunks over cached prefixes, then decodes crossing block boundaries, on 7-token blocks."""
    model = tiny_model()
    config = EngineConfig(
        block_size=7, num_blocks=48, max_num_batched_tokens=24, max_model_len=128, attention="triton",
        speculative_tokens=0,
    )  # fmt: skip
    engine = LLMEngine(model, config, frozenset())
    assert engine.attention.name == "triton"
    spy = LogitsSpy(engine)
    outs = engine.generate(prompts([3, 30]), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [len(o) for o in outs] == [6, 6]
    assert_matches_reference(model, spy)
