"""How the native decoder step spreads over threads (backend/kernels/team.h: fork, pool, region) never reaches its
bits: every choice, at 1 and 2 threads, gives the rows and the K/V pool of the step alone on one thread, for a
prefill of two sequences and a decode of both, on the tiny model and on Llama-3.2-1B's layer shape. And at that
shape the second thread does work (its share is counted), so the equality is not one thread's twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from backend.kernels import load
from backend.model.llama import LlamaModel
from backend.model.native_step import PagedStep
from tests.backend.test_native_step import caches, dataclass_ctx, int4_model, native, needs_kernel, rand_ids
from tests.backend.test_native_step_large import large_model

MODES = ("fork", "pool", "region")


@pytest.fixture
def restore_threading() -> Iterator[None]:
    threads, mode = torch.get_num_threads(), load.step_threading()
    yield
    torch.ops.tokenedge.set_step_threading(mode)
    torch.set_num_threads(threads)


def two_steps(model: LlamaModel) -> list[torch.Tensor]:
    """A 20- and a 33-token prompt prefilled in one step, then one decode step of both: both steps' rows, then
    the pool's K and V of every layer."""
    a, b = rand_ids(21, seed=11), rand_ids(34, seed=12)
    k, v = caches(model, blocks=8)
    prefill = dataclass_ctx(
        slots=[*range(20), *range(48, 81)], tables=[[0, 1, 0], [3, 4, 5]], lens=[20, 33], query_lens=[20, 33]
    )
    first = native(model, a[:20] + b[:33], [*range(20), *range(33)], PagedStep(prefill, k, v))
    decode = dataclass_ctx(slots=[20, 81], tables=[[0, 1, 0], [3, 4, 5]], lens=[21, 34], query_lens=[1, 1])
    second = native(model, [a[20], b[33]], [20, 33], PagedStep(decode, k, v))
    return [first, second, *k, *v]


def each_threading(model: LlamaModel, worker_helps: bool) -> None:
    """Every design at 2 threads against fork at 1; with `worker_helps`, the second thread must have run items
    (a tiny model's step can end before a sleeping worker wakes: the caller then does it all, by design)."""
    torch.set_num_threads(1)
    torch.ops.tokenedge.set_step_threading("fork")
    alone = two_steps(model)
    torch.set_num_threads(2)
    for mode in MODES:
        torch.ops.tokenedge.set_step_threading(mode)
        before = torch.ops.tokenedge.step_threading_worker_items()
        got = two_steps(model)
        assert all(torch.equal(x, y) for x, y in zip(got, alone, strict=True)), f"{mode}: other bits"
        if (
            worker_helps and mode != "fork"
        ):  # the worker takes its share (bounded: an OS that never runs it fails the test)
            for _ in range(20):
                if torch.ops.tokenedge.step_threading_worker_items() > before:
                    break
                assert all(torch.equal(x, y) for x, y in zip(two_steps(model), alone, strict=True))
            assert torch.ops.tokenedge.step_threading_worker_items() > before, (
                f"{mode}: one thread did it all"
            )


@needs_kernel
def test_every_threading_gives_the_bits_of_one_thread(restore_threading: None) -> None:
    each_threading(int4_model(), worker_helps=False)


@needs_kernel
def test_every_threading_gives_the_bits_of_one_thread_at_a_real_shape(restore_threading: None) -> None:
    each_threading(large_model(), worker_helps=True)


@needs_kernel
def test_a_threading_is_named_or_refused(monkeypatch: pytest.MonkeyPatch, restore_threading: None) -> None:
    monkeypatch.setenv(load.THREADING_ENV, "Pool ")
    assert load.step_threading() == "pool"
    monkeypatch.setenv(load.THREADING_ENV, "threads")
    with pytest.raises(ValueError, match="fork, pool, region"):
        load.step_threading()
    with pytest.raises(RuntimeError, match="fork, pool or region"):
        torch.ops.tokenedge.set_step_threading("threads")
