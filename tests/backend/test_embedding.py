"""Embedding sequences in the engine: the pooled state is the model's own, whatever shares the batch.

The oracle is the model's full-recompute forward (plain causal attention, no cache): its final-norm hidden
state at the last position. Batched, chunked and prefix-cached runs must give the run alone's vector, and
generation sharing those steps must be unchanged.

`assert_same` asserts the strongest equality the engine claims. With issue 14's batch-invariant mode
(`EngineConfig.batch_invariant`, default on) it is bitwise: an embedding is an embedding sequence's final hidden
state, the row the invariant logits come from (checked on a trial merge with issue 14: every test here passes with
`torch.equal`). On a tree without that mode it is close, not bitwise: MKL's fp32 GEMM rows depend on M, the number
of tokens in the forward (measured: five short embeddings batched together differ from each alone in the last bits).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.engine.embedding import EmbeddingOut
from backend.engine.errors import InvalidRequestError
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.model.llama import LlamaModel, _causal_attention
from harness.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def make_engine(model: LlamaModel, **overrides: int) -> LLMEngine:
    config = EngineConfig(
        speculative_tokens=0,
        **{"num_blocks": 64, "max_num_batched_tokens": 128, "max_model_len": 256, **overrides},
    )
    return LLMEngine(model, config, eos_token_ids=frozenset({0}))


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


BITWISE = getattr(EngineConfig(), "batch_invariant", False)  # issue 14's mode, when this tree has it


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if BITWISE:
        assert torch.equal(actual, expected), float((actual - expected).abs().max())
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def run_to_end(engine: LLMEngine) -> dict[str, EmbeddingOut]:
    results: dict[str, EmbeddingOut] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if isinstance(out.token, EmbeddingOut):
                results[out.request_id] = out.token
    return results


def reference_state(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    tokens = torch.tensor(ids)
    hidden = model(tokens, torch.arange(len(ids)), lambda _layer, q, k, v: _causal_attention(q, k, v))
    return hidden[-1]  # [hidden] fp32, after the final norm


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny_model(seed=3)


def test_the_pooled_state_is_the_last_tokens_final_hidden_state(model: LlamaModel) -> None:
    engine = make_engine(model)
    ids = prompt(37, seed=1)
    engine.add_embedding("e", engine.prompt(ids))
    out = run_to_end(engine)["e"]
    assert out.vector.shape == (model.config.hidden_size,) and out.vector.dtype == torch.float32
    assert out.num_prompt_tokens == 37
    torch.testing.assert_close(out.vector, reference_state(model, ids), rtol=1e-5, atol=1e-5)


def test_an_embedding_is_the_same_alone_and_batched_with_chunked_prefill(model: LlamaModel) -> None:
    ids = prompt(53, seed=2)
    alone_engine = make_engine(model)
    alone_engine.add_embedding("alone", alone_engine.prompt(ids))
    alone = run_to_end(alone_engine)["alone"].vector

    engine = make_engine(model, max_num_batched_tokens=40)  # 53 tokens: at least two chunks
    for i in range(3):
        engine.add_request(f"g{i}", engine.prompt(prompt(20 + i, seed=10 + i)), GREEDY)
    engine.add_embedding("other", engine.prompt(prompt(30, seed=4)))
    engine.add_embedding("batched", engine.prompt(ids))
    batched = run_to_end(engine)

    assert_same(batched["batched"].vector, alone)
    assert (batched["other"].vector - alone).abs().max() > 0.1
    stats = engine.stats()
    assert stats.running == stats.waiting == 0 and stats.blocks_free == stats.blocks_total


def test_a_prefix_cached_embedding_reuses_the_blocks_and_agrees(model: LlamaModel) -> None:
    ids = prompt(53, seed=2)
    engine = make_engine(model)
    engine.add_embedding("first", engine.prompt(ids))
    first = run_to_end(engine)["first"]
    engine.add_embedding("cached", engine.prompt(ids))
    cached = run_to_end(engine)["cached"]
    # three full blocks reused, and 4 rows of the fourth, which the first left partly filled (the last token
    # is always computed)
    assert first.num_cached_tokens == 0 and cached.num_cached_tokens == 52
    assert_same(cached.vector, first.vector)


def test_generation_sharing_steps_with_embeddings_is_unchanged(model: LlamaModel) -> None:
    prompts = [prompt(15 + i, seed=20 + i) for i in range(3)]
    alone = make_engine(model).generate(prompts, GREEDY)
    engine = make_engine(model, max_num_batched_tokens=48)
    for i in range(4):
        engine.add_embedding(f"e{i}", engine.prompt(prompt(25, seed=30 + i)))
    assert engine.generate(prompts, GREEDY) == alone


def test_invalid_embedding_prompts_are_refused(model: LlamaModel) -> None:
    engine = make_engine(model)
    for ids in ([], [1] * 256, [1, 256]):
        with pytest.raises(InvalidRequestError):
            engine.prompt(ids)


async def test_async_embeds_batch_together_and_cancelling_frees_the_blocks(model: LlamaModel) -> None:
    config = EngineConfig(
        speculative_tokens=0, num_blocks=64, max_num_batched_tokens=64, max_model_len=256, max_waiting=16
    )
    engine = AsyncEngine(model, config, frozenset())
    await engine.start()
    try:
        texts = [prompt(10 + 7 * i, seed=40 + i) for i in range(5)]
        together = await asyncio.gather(
            *(engine.embed(engine.prompt(ids), f"r{i}") for i, ids in enumerate(texts))
        )
        for ids, out in zip(texts, together, strict=True):
            assert_same(out.vector, (await engine.embed(engine.prompt(ids), "again")).vector)
        task = asyncio.create_task(engine.embed(engine.prompt(prompt(200, seed=50)), "cancelled"))
        await asyncio.sleep(0)  # let it submit
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await engine.embed(
            engine.prompt([1, 2, 3]), "after"
        )  # commands apply in order: the abort is done by now
        stats = engine.stats()
        assert stats.running == stats.waiting == 0 and stats.blocks_free == stats.blocks_total
    finally:
        await engine.stop()
