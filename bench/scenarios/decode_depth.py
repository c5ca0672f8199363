"""Decode at depth: 32 greedy decode steps after a context of `depth` tokens, our engine alone against
`llama-bench -d depth -n 32` on llama.cpp's formats, at each thread count, side by side, the order alternated
round by round. A chat's later turns decode over thousands of tokens of context, where attention, not the
weights, sets the pace; tg32 at depth 0 (`engine_alone`, `bench backend`) does not see it.

    python -m bench decode_depth [--threads 1,2] [--depths 0,512,1536] [--formats Q4_0,IQ4_NL] [--rounds 2]

Ours runs in a subprocess per thread count (`--ours T`), the shipped model, quantized, no speculation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from backend.loader import default_model_path
from backend.runtime import cpu_model
from bench.measure.load import write_results
from harness.peers.llamacpp_build import LlamaBuild, ensure_build
from harness.peers.llamacpp_formats import requantized, shipped_format


def ours(threads: int, depths: list[int], model: Path) -> dict[int, float]:
    argv = [sys.executable, "-m", "bench", "decode_depth", "--ours", str(threads), "--model", str(model)]
    argv += ["--depths", ",".join(map(str, depths))]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=3600)
    return {int(d): r for d, r in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def peer(
    build: LlamaBuild, files: dict[str, Path], threads: int, depths: list[int]
) -> dict[str, dict[int, float]]:
    argv = [str(build.bench), *(a for path in files.values() for a in ("-m", str(path)))]
    argv += [
        "-t",
        str(threads),
        "-p",
        "0",
        "-n",
        "32",
        "-d",
        ",".join(map(str, depths)),
        "-r",
        "3",
        "-o",
        "json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=3600)
    by_path = {str(path): fmt for fmt, path in files.items()}
    rates: dict[str, dict[int, float]] = {}
    for row in json.loads(done.stdout):
        rates.setdefault(by_path[row["model_filename"]], {})[int(row["n_depth"])] = float(row["avg_ts"])
    return rates


def table(threads: int, rounds: list[dict[str, dict[int, float]]], depths: list[int], label: str) -> str:
    sides = list(rounds[0])
    median = {s: {d: statistics.median(r[s][d] for r in rounds) for d in depths} for s in sides}
    head = f"{'depth':>6} " + " ".join(f"{s:>16}" for s in sides) + "  ours / fastest peer"
    lines = [
        f"tg32 tok/s after a context of `depth` tokens, {threads} thread(s), medians of {len(rounds)}",
        head,
    ]
    for d in depths:
        best = max(median[s][d] for s in sides if s != label)
        cells = " ".join(f"{median[s][d]:>16.1f}" for s in sides)
        lines.append(f"{d:>6} {cells}  {median[label][d] / best:.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench decode_depth", description=__doc__)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--depths", default="0,512,1536")
    parser.add_argument(
        "--formats", default="Q4_0,IQ4_NL", help="llama.cpp formats (default: this CPU's fastest)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", help="a GGUF file (default: the shipped SmolLM2)")
    parser.add_argument(
        "--ours", type=int, help=argparse.SUPPRESS
    )  # the subprocess: ours at this thread count
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    model = Path(args.model) if args.model else default_model_path()
    if args.ours:
        from bench.measure.engine import depth_rates

        print(json.dumps(depth_rates(args.ours, depths, model)))
        return
    build = ensure_build()
    shipped = shipped_format(model)
    files = {fmt: requantized(build, model, fmt, shipped) for fmt in args.formats.split(",")}
    label = f"tokenedge {shipped}"
    print(f"CPU: {cpu_model()}\nbuild: {build.describe()}\nmodel: {model.name} ({shipped})", flush=True)
    results: dict[int, list[dict[str, dict[int, float]]]] = {}
    for r in range(args.rounds):
        for t in (int(x) for x in args.threads.split(",")):
            measured: dict[str, dict[int, float]] = {}
            for side in ("ours", "peer") if r % 2 == 0 else ("peer", "ours"):
                measured.update(
                    {label: ours(t, depths, model)} if side == "ours" else peer(build, files, t, depths)
                )
            results.setdefault(t, []).append({label: measured[label], **{f: measured[f] for f in files}})
    for t, rounds in results.items():
        print(table(t, rounds, depths, label))
    payload = {
        "cpu": cpu_model(),
        "build": build.describe(),
        "model": model.name,
        "depths": depths,
        "threads": results,
    }
    print(f"results: {write_results('decode_depth', payload)}")


if __name__ == "__main__":
    main()
