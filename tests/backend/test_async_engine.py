"""AsyncEngine: concurrent streams, cancellation frees blocks, a full waiting queue is refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import torch

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.engine.errors import EngineStoppedError, InvalidRequestError, QueueFullError
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import TokenOut
from backend.engine.sampling import SamplingParams
from harness.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
CONFIG = EngineConfig(
    speculative_tokens=0, num_blocks=64, max_num_batched_tokens=64, max_model_len=256, max_waiting=8
)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def collect(stream: AsyncIterator[TokenOut]) -> list[TokenOut]:
    return [token async for token in stream]


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    async_engine = AsyncEngine(tiny_model(), CONFIG, frozenset())
    await async_engine.start()
    yield async_engine
    await async_engine.stop()


async def test_concurrent_requests_match_sequential_greedy(engine: AsyncEngine) -> None:
    prompts = [prompt(n, seed) for seed, n in enumerate((5, 30, 17, 50))]
    expected = LLMEngine(tiny_model(), CONFIG, frozenset()).generate(prompts, GREEDY)
    results = await asyncio.gather(
        *(collect(engine.generate(engine.prompt(p), GREEDY, f"r{i}")) for i, p in enumerate(prompts))
    )
    assert [[t.token_id for t in r] for r in results] == expected
    for p, r in zip(prompts, results, strict=True):
        assert r[-1].finish_reason == "length" and all(t.finish_reason is None for t in r[:-1])
        assert r[0].num_prompt_tokens == len(p)
    stats = engine.stats()
    assert stats.running == stats.waiting == 0 and stats.blocks_free == stats.blocks_total
    assert stats.generated_tokens_total == 4 * 12


async def test_closing_a_stream_aborts_the_request_and_frees_its_blocks(engine: AsyncEngine) -> None:
    long_run = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = engine.generate(engine.prompt(prompt(40, 1)), long_run, "cancelled")
    first = await anext(stream)
    assert first.finish_reason is None
    await stream.aclose()
    # commands are applied in order: once a later request finishes, the abort has been applied
    await collect(engine.generate(engine.prompt(prompt(5, 2)), GREEDY, "after"))
    stats = engine.stats()
    assert stats.running == 0 and stats.blocks_free == stats.blocks_total
    assert stats.generated_tokens_total < 200


async def test_cancelling_the_consumer_task_aborts_the_request(engine: AsyncEngine) -> None:
    long_run = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    got_first = asyncio.Event()

    async def consume() -> None:
        async with contextlib.aclosing(
            engine.generate(engine.prompt(prompt(20, 3)), long_run, "task")
        ) as stream:
            async for _ in stream:
                got_first.set()

    task = asyncio.create_task(consume())
    await got_first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await collect(engine.generate(engine.prompt(prompt(5, 4)), GREEDY, "after"))
    stats = engine.stats()
    assert stats.running == 0 and stats.blocks_free == stats.blocks_total


async def test_full_waiting_queue_raises_queue_full() -> None:
    engine = AsyncEngine(
        tiny_model(),
        EngineConfig(speculative_tokens=0, num_blocks=64, max_model_len=256, max_waiting=2),
        frozenset(),
    )
    # not started yet: submissions wait in the inbox and count as waiting
    streams = [engine.generate(engine.prompt(prompt(8, i)), GREEDY, f"q{i}") for i in range(2)]
    assert engine.stats().waiting == 2
    with pytest.raises(QueueFullError):
        engine.generate(engine.prompt(prompt(8, 9)), GREEDY, "overflow")
    await engine.start()
    try:
        results = await asyncio.gather(*(collect(s) for s in streams))
    finally:
        await engine.stop()
    assert all(len(r) == 12 for r in results)
    with pytest.raises(EngineStoppedError):
        engine.generate(engine.prompt(prompt(8, 1)), GREEDY, "late")


async def test_invalid_prompt_is_refused_before_streaming(engine: AsyncEngine) -> None:
    with pytest.raises(InvalidRequestError):
        engine.prompt([])
    with pytest.raises(InvalidRequestError):
        engine.prompt(list(range(1, 255)) * 2)


async def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving(engine: AsyncEngine) -> None:
    real_step = engine._engine.step
    calls = {"n": 0}

    def failing_once() -> list:  # type: ignore[type-arg]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_step()

    engine._engine.step = failing_once  # type: ignore[method-assign]
    with pytest.raises(EngineStoppedError, match="boom"):
        await collect(engine.generate(engine.prompt(prompt(8, 5)), GREEDY, "fails"))
    tokens = await collect(engine.generate(engine.prompt(prompt(8, 6)), GREEDY, "recovers"))
    assert len(tokens) == 12
    stats = engine.stats()
    assert stats.running == 0 and stats.blocks_free == stats.blocks_total
