"""The scripted decoder stack (backend/model/scripted.py) gives the eager layers' bits on every step shape:
batch-1 decodes, decode batches, chunked prefills mixed with decodes (several attention calls a step), steps
longer than a linear's row tile, for dense fp32/bf16 and int4/int8 projections; and it follows weight changes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from backend.attention.invariant import StepAttention
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.model.llama import LlamaModel
from tests.backend.test_quant import _quantized_tiny
from tests.backend.tiny import tiny_config, tiny_model, tiny_weights, unaligned_config

MODELS: dict[str, Callable[[], LlamaModel]] = {
    "fp32": lambda: tiny_model(seed=3),
    "bf16": lambda: tiny_model(seed=3, dtype=torch.bfloat16),
    "fp32-unaligned": lambda: _unaligned_tiny(),
    "int4": lambda: _quantized_tiny(with_blocks=True),  # type: ignore[return-value]
    "int8": lambda: _quantized_tiny(with_blocks=False),  # type: ignore[return-value]
}


def _unaligned_tiny() -> LlamaModel:
    """Rows and head vectors off 16-byte boundaries: the tile copies and the padded queries run scripted."""
    model = LlamaModel(unaligned_config(), dtype=torch.float32)
    model.load_weights(tiny_weights(unaligned_config(), seed=3))
    return model


def checked_forward(model: LlamaModel, seen: list[tuple[int, bool]]) -> None:
    """Make every engine forward run both paths and assert the same bits; log (tokens, one call) per step."""
    forward = model.forward

    def both(
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: object,
        invariant: bool = False,
        step: StepAttention | None = None,
    ) -> torch.Tensor:
        assert step is not None and model.scripted_stack(invariant) is not None
        eager = forward(token_ids, positions, attend, invariant)  # type: ignore[arg-type]
        scripted = forward(token_ids, positions, attend, invariant, step)  # type: ignore[arg-type]
        diff = (eager - scripted).abs().max().item()
        assert torch.equal(eager, scripted), (
            f"scripted stack differs by {diff} on {token_ids.shape[0]} tokens"
        )
        seen.append((token_ids.shape[0], step.in_order))
        return scripted

    model.forward = both  # type: ignore[method-assign]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_scripted_stack_gives_the_eager_bits_on_every_step_shape(kind: str) -> None:
    model = MODELS[kind]()
    seen: list[tuple[int, bool]] = []
    checked_forward(model, seen)
    config = EngineConfig(
        speculative_tokens=0, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=48, max_model_len=256
    )
    prompts = [[(5 * i + 3 * j) % 250 + 1 for j in range(n)] for i, n in enumerate([3, 70, 9, 40, 1])]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    LLMEngine(model, config, frozenset()).generate(prompts[:1], params)  # batch-1 decodes
    LLMEngine(model, config, frozenset()).generate(prompts, params)
    tile = max(t.tile_rows for t in model.tilings.values())
    assert any(n == 1 for n, _ in seen), "no batch-1 decode step"
    assert any(not in_order for _, in_order in seen), "no step with several attention calls"
    assert any(n > tile for n, _ in seen), f"no step past the {tile}-row tile"


def test_the_stack_follows_new_weights() -> None:
    model = tiny_model(seed=3)
    config = EngineConfig(speculative_tokens=0, num_blocks=64, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = [[11, 22, 33, 44]]
    before = LLMEngine(model, config, frozenset()).generate(prompt, params)
    stack = model.scripted_stack(True)
    model.load_weights(tiny_weights(tiny_config(), seed=9))
    assert model.scripted_stack(True) is not stack
    seen: list[tuple[int, bool]] = []
    checked_forward(model, seen)
    after = LLMEngine(model, config, frozenset()).generate(prompt, params)
    assert seen and after != before
