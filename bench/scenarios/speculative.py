"""Prompt-lookup speculation on vs off, same engine build, same run: a copy-heavy workload (quote, rewrite or
fix a given passage) and a free-generation one, greedy, one request at a time, alternating rounds, medians.

Outputs must be identical with and without speculation (the run fails otherwise); the table gives tokens/s,
the acceptance rate and the tokens per verify forward.

    python -m bench speculative --threads 2 --k 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.loader import LoadedModel, load_model
from backend.model.llama import LlamaModel
from backend.model.quant import quantize_model
from bench.measure.load import write_results

WORKLOAD = Path(__file__).resolve().parent / "data" / "copy_workload.json"


def engine(model: LlamaModel, loaded: LoadedModel, k: int) -> LLMEngine:
    config = EngineConfig(
        num_blocks=256, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024, speculative_tokens=k
    )
    return LLMEngine(model, config, loaded.tokenizer.eos_token_ids)


def run(eng: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """tokens/s over the prompts, one request at a time (batch-1 latency is where speculation pays)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs, tokens, start = [], 0, time.perf_counter()
    for ids in prompts:
        [out] = eng.generate([ids], params)
        outs.append(out)
        tokens += len(out)
    return tokens / (time.perf_counter() - start), outs


def measure(loaded: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    model = LlamaModel(loaded.config, dtype=torch.bfloat16)
    model.load_weights(loaded.weights)
    if args.weights == "quantized":
        quantize_model(model, loaded.weights, loaded.quantized)
    tok = loaded.tokenizer
    work = json.loads(WORKLOAD.read_text())
    result: dict[str, Any] = {}
    for name in ("copy", "free"):
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in work[name]]
        plain, spec = engine(model, loaded, 0), engine(model, loaded, args.k)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            rate_off, out_off = run(plain, prompts, args.max_tokens)
            rate_on, out_on = run(spec, prompts, args.max_tokens)
            if out_on != out_off:
                raise SystemExit(f"{name}: speculative output differs from plain greedy output")
            rates["off"].append(rate_off)
            rates["on"].append(rate_on)
        s = spec.stats()
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        result[name] = {
            "off_tok_s": off,
            "on_tok_s": on,
            "ratio": on / off,
            "acceptance": s.spec_accepted_tokens_total / max(1, s.spec_draft_tokens_total),
            "tokens_per_verify": (s.spec_accepted_tokens_total + s.spec_verify_steps_total)
            / max(1, s.spec_verify_steps_total),
        }
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--k",
        type=int,
        default=EngineConfig().speculative_tokens,
        help="drafts per verify (the served default)",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", choices=("quantized", "dequantized"), default="quantized")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(load_model(None, progress=False), args)
    print(
        f"\nspeculation k={args.k}, --weights {args.weights}, {torch.get_num_threads()} threads, outputs identical"
    )
    print(f"{'workload':<10}{'off tok/s':>11}{'on tok/s':>10}{'ratio':>8}{'accept':>8}{'tok/verify':>12}")
    for name, r in result.items():
        print(
            f"{name:<10}{r['off_tok_s']:>11.1f}{r['on_tok_s']:>10.1f}{r['ratio']:>7.2f}x"
            f"{r['acceptance']:>8.2f}{r['tokens_per_verify']:>12.2f}"
        )
    record = {"benchmark": "speculative", "k": args.k, **result}
    print(f"wrote {write_results(f'speculative-{int(time.time())}', record)}")


if __name__ == "__main__":
    main()
