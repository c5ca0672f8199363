"""Our engine alone, measured the way `llama-bench` measures llama.cpp's: tg32 (32 greedy decode steps of one
sequence, no speculation, tokens/s of the steps alone) and pp128 (one 128-token prefill, a new prompt each
repetition so no prefix cache serves it). In process, the served defaults otherwise (quantized, batch-invariant),
so the native decoder step runs where tokenedge's int4 kernel does. `bench backend` prints it beside
llama-bench's numbers from the same minutes.

    python -m bench engine_alone --threads 1 [--model FILE.gguf]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench.measure.engine import engine_rates


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench engine_alone", description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", help="a GGUF file (default: the shipped SmolLM2)")
    args = parser.parse_args(argv)
    for name, rate in engine_rates(args.threads, Path(args.model) if args.model else None).items():
        print(f"{name}: {rate:.1f}")
