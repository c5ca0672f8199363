"""Where a backend step spends its time: `torch.profiler` over batch-1 decode, 8 concurrent decodes and a
250-token prefill of SmolLM2 through the engine (quantized default, batch-invariant), plus CPU time per step.

CPU time (`time.process_time`) rather than wall time: on a shared machine it moves far less with other jobs
than wall time does, so two builds compared by it, alternately, give a usable ratio (at 1 thread: with more,
the waiting threads' spinning is counted too). The README's "where the time goes" comes from this.

    python -m bench backend_profile --threads 1 --steps 20
    python -m bench backend_profile --ab 5     # the native decoder step vs the eager layers, alternating rounds
    python -m bench backend_profile --kernel-ab 5 --threads 2   # the AMX int4 kernel vs torch's (wall time)
    python -m bench backend_profile --kernel-micro --threads 2  # the two int4 kernels alone, by rows

`--ab N` skips the profiler and measures the native decoder step (backend/model/native_step.py) against the
same model's eager layers, N alternating rounds in one process: the same
weights, caches and machine state, so the median of the per-round ratios is a fair same-run A/B.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.loader import LoadedModel, load_model
from backend.loader.quantized import Int4Blocks
from backend.model.llama import LlamaModel
from backend.model.quant import Int4Linear, quantize_model
from bench.measure.engine import prefill_prompts, prompts


def decode_steps(
    engine: LLMEngine, batch: list[list[int]], steps: int, clock: Callable[[], float] = time.process_time
) -> Callable[[], list[float]]:
    """A scenario: admit `batch`, prefill it, then time `steps` decode steps (ms of `clock` each: CPU time by
    default); aborts after."""
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)

    def run() -> list[float]:
        ids = [f"profile-{time.monotonic_ns()}-{i}" for i in range(len(batch))]
        for rid, prompt in zip(ids, batch, strict=True):
            engine.add_request(rid, engine.prompt(prompt), params)
        while engine.scheduler.waiting:
            engine.step()
        engine.step()  # every sequence decoding from here on
        times = []
        for _ in range(steps):
            start = clock()
            engine.step()
            times.append((clock() - start) * 1e3)
        for rid in ids:
            engine.abort_request(rid)
        return times

    return run


def prefill(engine: LLMEngine, fresh: list[list[int]]) -> Callable[[], list[float]]:
    """A scenario: one prompt of `fresh` per call (a new one each time: no prefix cache hit)."""

    def run() -> list[float]:
        ids = fresh.pop()
        start = time.process_time()
        engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        return [(time.process_time() - start) * 1e3]

    return run


def eager_layers(model: LlamaModel) -> Callable[[bool], None]:
    """A switch between the native decoder step (True) and the eager layers (False) for the engine's forwards."""
    native = model.native_stack

    def use(on: bool) -> None:
        model.native_stack = native if on else lambda: None  # type: ignore[method-assign]

    return use


def ab_rounds(
    scenarios: dict[str, tuple[Callable[[], list[float]], Callable[[], list[float]]]],
    labels: tuple[str, str],
    rounds: int,
    unit: str,
) -> None:
    """Alternate the two sides' rounds per scenario; print medians and the median per-round ratio (a / b)."""
    for name, (run_a, run_b) in scenarios.items():
        ratios, a_ms, b_ms = [], [], []
        for _ in range(rounds):
            a_ms.append(statistics.median(run_a()))
            b_ms.append(statistics.median(run_b()))
            ratios.append(a_ms[-1] / b_ms[-1])
        print(
            f"{name}: {labels[0]} {statistics.median(a_ms):.2f}, {labels[1]} {statistics.median(b_ms):.2f} "
            f"{unit} per step; {labels[1]} is {statistics.median(ratios):.3f}x faster (median of {rounds} "
            "paired rounds)"
        )


def native_ab(engine: LLMEngine, loaded: LoadedModel, steps: int, rounds: int) -> None:
    """The native decoder step vs the same model's eager layers, CPU time (`--ab`)."""
    use = eager_layers(engine.model)
    batch = prompts(loaded)

    def side(batch: list[list[int]], on: bool) -> Callable[[], list[float]]:
        run = decode_steps(engine, batch, steps)
        return lambda: (use(on), run())[1]

    scenarios = {
        "batch-1 decode": (side(batch[:1], False), side(batch[:1], True)),
        "8 concurrent decode": (side(batch, False), side(batch, True)),
    }
    ab_rounds(scenarios, ("eager", "native"), rounds, "CPU ms")
    use(True)


def kernel_ab(loaded: LoadedModel, config: EngineConfig, steps: int, rounds: int) -> None:
    """The AMX int4 kernel vs torch's, one engine each over the same weights, wall time (`--kernel-ab`)."""
    engines = {}
    for kernel in ("torch", "amx"):
        model = LlamaModel(loaded.config, dtype=torch.bfloat16)
        model.load_weights(loaded.weights)
        quantize_model(model, loaded.weights, loaded.quantized, kernel)
        engines[kernel] = LLMEngine(model, config, loaded.tokenizer.eos_token_ids)
    batch = prompts(loaded)
    scenarios = {
        name: tuple(decode_steps(engines[k], rows, steps, time.perf_counter) for k in ("torch", "amx"))
        for name, rows in (("batch-1 decode", batch[:1]), ("8 concurrent decode", batch))
    }
    ab_rounds(scenarios, ("torch int4", "amx int4"), rounds, "wall ms")  # type: ignore[arg-type]


def kernel_micro(rows: Sequence[int] = (1, 2, 4, 8, 16, 64), rounds: int = 5) -> None:
    """The two int4 kernels alone on SmolLM2's 120 projection shapes (random codes), back to back, weights hot:
    ms per pass, best of `rounds` alternating rounds (`--kernel-micro`)."""
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30
    gen = torch.Generator().manual_seed(0)
    weights = [
        Int4Blocks(
            torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
            torch.rand(n, k // 32) / 50,
            torch.rand(n, k // 32) / 100,
        )
        for n, k in shapes
    ]
    layers = {kernel: [Int4Linear(b, kernel) for b in weights] for kernel in ("torch", "amx")}
    for m in rows:
        xs = {k: torch.randn(m, k).to(torch.bfloat16) for k in (576, 1536)}
        best = {kernel: float("inf") for kernel in layers}
        for _ in range(rounds):
            for kernel, group in layers.items():
                start = time.perf_counter()
                for layer in group:
                    layer.matmul(xs[layer.in_features])
                best[kernel] = min(best[kernel], (time.perf_counter() - start) * 1e3)
        print(
            f"{m:>3} rows: torch int4 {best['torch']:.2f} ms, amx int4 {best['amx']:.2f} ms, {best['torch'] / best['amx']:.2f}x"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=12, help="profiler table rows per scenario")
    parser.add_argument(
        "--ab", type=int, default=0, help="rounds of the native step vs eager layers (no profiler)"
    )
    parser.add_argument("--kernel-ab", type=int, default=0, help="rounds of the AMX vs torch int4 kernel")
    parser.add_argument(
        "--kernel-micro", action="store_true", help="the two int4 kernels alone, 120 projections"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.kernel_micro:
        kernel_micro()
        return
    loaded = load_model()
    config = EngineConfig(num_blocks=512, max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024)
    if args.kernel_ab:
        kernel_ab(loaded, config, args.steps, args.kernel_ab)
        return
    model = LlamaModel(loaded.config, dtype=torch.bfloat16)
    model.load_weights(loaded.weights)
    quantize_model(model, loaded.weights, loaded.quantized)
    engine = LLMEngine(model, config, loaded.tokenizer.eos_token_ids)
    batch = prompts(loaded)
    scenarios = {
        "batch-1 decode": decode_steps(engine, batch[:1], args.steps),
        "8 concurrent decode": decode_steps(engine, batch, args.steps),
        "prefill 250": prefill(engine, prefill_prompts(loaded, 1)),
    }
    if args.ab:
        native_ab(engine, loaded, args.steps, args.ab)
        return
    for name, run in scenarios.items():
        run()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            times = run()
        print(f"\n{name}: {statistics.median(times):.1f} CPU ms per step ({args.threads} threads)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
