"""The native decoder step alone (backend/kernels/decoder_step.cpp) under each threading design of
backend/kernels/team.h (`fork`, `pool`, `region`; a suffix `@N` sets the runs' split) at each thread count: a
decode step of 1 and of 8 sequences and a prefill, in rounds whose cases alternate, so every design meets the
same minutes of a shared machine. Every output is checked bitwise against the round's first (the designs and the
threads must not change a bit).

A shape (`--shape`, harness/models/random_gguf.py's published configurations) runs its projections as random 4-bit
codes packed straight for the kernel: the sizes the random GGUF has (speed only), without loading its dense copy.
`--model FILE.gguf` (or `shipped`) runs a real file's layers.

The machine is shared, so each sample (about `--sample` seconds of steps) records the CPU other processes used
meanwhile (/proc/stat less this process), `--wait-quiet` waits before each round until they use under `--quiet`
cores, and the table's medians are over the quiet samples only: thread scaling measured while another job holds a
core is the other job's number.

    python -m bench.scenarios.step_threads [--shape smollm2-1.7b | --model shipped] [--modes fork,pool,region]
                                           [--threads 1,2] [--batches 1,8] [--prefill 128] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.attention.context import AttentionContext
from backend.kernels.load import int4_kernel
from backend.kernels.ops import pack_int4
from backend.loader import default_model_path, load_model
from backend.model.llama import LlamaModel
from backend.model.native_step import NativeStack, PagedStep, build_native
from backend.model.quant import quantize_model
from harness.models.random_gguf import SHAPES

BLOCK = 16
HZ = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Dims:
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int


def busy_jiffies() -> int:
    """Every CPU's busy time so far (all but idle and iowait)."""
    with open("/proc/stat") as f:
        parts = [int(v) for v in f.readline().split()[1:]]
    return sum(parts) - parts[3] - parts[4]


def own_jiffies() -> int:
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def shaped_stack(name: str) -> tuple[Dims, NativeStack]:
    """The shape's layers as the native step takes them, from random codes (speed only)."""
    s = SHAPES[name]
    gen = torch.Generator().manual_seed(0)

    def linear(n: int, k: int) -> list[torch.Tensor]:
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scales = torch.full((n, k // 32), 1 / (4.6 * k**0.5))
        return list(pack_int4(codes, scales, torch.zeros_like(scales)))

    kv = s.kv_heads * s.head_dim
    weights: list[torch.Tensor] = []
    for _ in range(s.layers):
        weights += [torch.ones(s.hidden), torch.ones(s.hidden)]
        for n, k in (
            (s.hidden + 2 * kv, s.hidden),
            (s.hidden, s.hidden),
            (2 * s.ffn, s.hidden),
            (s.hidden, s.ffn),
        ):
            weights += linear(n, k)
    dims = [s.heads, s.kv_heads, s.head_dim, s.ffn]
    return Dims(s.layers, s.hidden, s.kv_heads, s.head_dim), NativeStack(weights, dims, 1e-5)


def file_stack(path: str) -> tuple[Dims, NativeStack]:
    loaded = load_model(default_model_path() if path == "shipped" else path, progress=False)
    model = LlamaModel(loaded.config, dtype=torch.bfloat16)
    model.load_weights(loaded.weights)
    quantize_model(model, loaded.weights, loaded.quantized)
    c = loaded.config
    stack = build_native(list(model.layers), c)
    assert stack is not None, "the file's projections are not all on tokenedge's int4 kernel"
    return Dims(c.num_layers, c.hidden_size, c.num_kv_heads, c.head_dim), stack


def paged(batch: int, context: int, new: int, k: list[torch.Tensor], v: list[torch.Tensor]) -> PagedStep:
    """`batch` sequences of `context` tokens whose last `new` are this step's, each in blocks of its own."""
    per = -(-context // BLOCK)
    tables = torch.arange(batch * per, dtype=torch.int32).view(batch, per)
    slots = [
        int(tables[s, p // BLOCK]) * BLOCK + p % BLOCK
        for s in range(batch)
        for p in range(context - new, context)
    ]
    starts = torch.arange(batch + 1, dtype=torch.int32) * new
    lens = torch.full((batch,), context, dtype=torch.int32)
    ctx = AttentionContext(
        torch.tensor(slots), tables, lens, starts, (new,) * batch, (context,) * batch, BLOCK
    )
    return PagedStep(ctx, k, v)


def rope(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = positions.float()[:, None] * inv[None]
    both = torch.cat([angles, angles], dim=1)[:, None, :]
    return both.cos(), both.sin()


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    step: PagedStep
    x: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


def cases(d: Dims, batches: Sequence[int], context: int, prefill: int) -> list[Case]:
    blocks = max([*batches, 1]) * -(-max(context, prefill) // BLOCK)
    shape = (blocks, BLOCK, d.kv_heads, d.head_dim)
    k = [torch.randn(shape).to(torch.bfloat16) for _ in range(d.layers)]
    v = [torch.randn(shape).to(torch.bfloat16) for _ in range(d.layers)]
    gen = torch.Generator().manual_seed(1)
    out = []
    for b in batches:
        out.append(Case(f"decode b{b}", paged(b, context, 1, k, v), torch.randn(b, d.hidden, generator=gen),
                        *rope(torch.full((b,), context - 1), d.head_dim)))  # fmt: skip
    if prefill:
        out.append(Case(f"prefill {prefill}", paged(1, prefill, prefill, k, v),
                        torch.randn(prefill, d.hidden, generator=gen), *rope(torch.arange(prefill), d.head_dim)))  # fmt: skip
    return out


def sample(stack: NativeStack, case: Case, seconds: float) -> tuple[float, float, float]:
    """(wall s a step, CPU s a step, cores other processes used meanwhile) over about `seconds` of steps."""
    started = time.perf_counter()
    stack.run(case.x, case.cos, case.sin, case.step)
    reps = max(1, int(seconds / max(time.perf_counter() - started, 1e-4)))
    busy, own, cpu, wall = busy_jiffies(), own_jiffies(), time.process_time(), time.perf_counter()
    for _ in range(reps):
        stack.run(case.x, case.cos, case.sin, case.step)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    others = ((busy_jiffies() - busy) - (own_jiffies() - own)) / HZ / wall
    return wall / reps, cpu / reps, others


def wait_quiet(quiet: float, poll_s: float, deadline: float) -> None:
    while time.time() < deadline:
        busy, started = busy_jiffies(), time.perf_counter()
        time.sleep(1.0)
        if (busy_jiffies() - busy) / HZ / (time.perf_counter() - started) < quiet:
            return
        time.sleep(poll_s)


def set_threading(mode: str) -> None:
    name, _, split = mode.partition("@")
    torch.ops.tokenedge.set_step_threading(name, 100, int(split or 1))


Samples = dict[tuple[str, str, int], list[tuple[float, float, float]]]


def one_round(stack: NativeStack, all_cases: list[Case], modes: list[str], threads: list[int], seconds: float,
              samples: Samples, turn: int) -> None:  # fmt: skip
    """Every case under every design and thread count; the designs' order rotates with `turn`."""
    order = modes[turn % len(modes) :] + modes[: turn % len(modes)]
    for case in all_cases:
        first: torch.Tensor | None = None
        for mode in order:
            set_threading(mode)
            for t in threads:
                torch.set_num_threads(t)
                out = stack.run(case.x, case.cos, case.sin, case.step)
                assert first is None or torch.equal(out, first), (
                    f"{case.name}: {mode} at {t} threads changed bits"
                )
                first = out if first is None else first
                samples.setdefault((case.name, mode, t), []).append(sample(stack, case, seconds))


def report(samples: Samples, quiet: float) -> None:
    print(f"medians over samples while other processes used < {quiet} cores ({os.cpu_count()} CPUs)")
    print(
        f"{'case':13} {'design':9} {'thr':>3} {'quiet':>6} {'ms a step':>10} {'tok/s':>8} {'CPU ms':>8} {'speed':>6}"
    )
    base: dict[str, float] = {}
    for (name, mode, t), rows in samples.items():  # as the first round ran them: the first design first
        kept = [r for r in rows if r[2] < quiet]
        wall = statistics.median(r[0] for r in kept) if kept else float("nan")
        cpu = statistics.median(r[1] for r in kept) if kept else float("nan")
        base.setdefault(name, wall)  # the first design at the first thread count
        tokens = int(name.split()[-1].lstrip("b"))
        print(f"{name:13} {mode:9} {t:>3} {len(kept):>2}/{len(rows):<3} {wall * 1e3:10.2f} {tokens / wall:8.1f} "
              f"{cpu * 1e3:8.2f} {base[name] / wall:5.2f}x")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.scenarios.step_threads", description=__doc__)
    parser.add_argument("--shape", default="smollm2-1.7b", choices=sorted(SHAPES))
    parser.add_argument("--model", help="a GGUF file, or 'shipped', instead of a shape")
    parser.add_argument("--modes", default="fork,pool,region")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--context", type=int, default=256, help="keys each decoded token attends to")
    parser.add_argument("--prefill", type=int, default=128, help="tokens of the prefill case (0: none)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sample", type=float, default=0.5, help="seconds of steps per sample")
    parser.add_argument(
        "--quiet", type=float, default=0.15, help="other processes' cores a quiet sample allows"
    )
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, help="before each round wait for quiet (poll s)"
    )
    parser.add_argument("--max-minutes", type=float, default=60.0)
    args = parser.parse_args(argv)
    if int4_kernel() != "amx":
        raise SystemExit("the native step needs tokenedge's int4 kernel (an AVX512-VNNI/BF16 or AVX2 CPU)")
    dims, stack = file_stack(args.model) if args.model else shaped_stack(args.shape)
    all_cases = cases(dims, [int(b) for b in args.batches.split(",") if b], args.context, args.prefill)
    modes, threads = args.modes.split(","), [int(t) for t in args.threads.split(",")]
    samples: Samples = {}
    deadline = time.time() + args.max_minutes * 60
    print(f"{args.model or args.shape}: {dims}; load average at start {os.getloadavg()}")
    for turn in range(args.rounds):
        if args.wait_quiet:
            wait_quiet(args.quiet, args.wait_quiet, deadline)
        if time.time() > deadline:
            break
        one_round(stack, all_cases, modes, threads, args.sample, samples, turn)
    print(f"load average at end {os.getloadavg()}")
    report(samples, args.quiet)


if __name__ == "__main__":
    main()
