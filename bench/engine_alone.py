"""Our engine alone, measured the way `llama-bench` measures llama.cpp's: tg32 (32 greedy decode steps of one
sequence, no speculation, tokens/s of the steps alone) and pp128 (one 128-token prefill, a new prompt each
repetition so no prefix cache serves it). In process, the served defaults otherwise (quantized, batch-invariant),
so the native decoder step runs where tokenedge's int4 kernel does. `bench backend` prints it beside
llama-bench's numbers from the same minutes.

    python -m bench engine_alone --threads 1 [--model FILE.gguf]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.loader import load_model
from backend.model.llama import LlamaModel
from backend.model.quant import quantize_model


def engine_rates(threads: int, model_path: Path | None = None, repetitions: int = 5) -> dict[str, float]:
    """{'pp128_tok_s', 'tg32_tok_s'}: medians over `repetitions`, `threads` torch threads; the shipped model
    unless `model_path` names another GGUF."""
    torch.set_num_threads(threads)
    loaded = load_model(model_path, progress=False)
    model = LlamaModel(loaded.config, dtype=torch.bfloat16)
    model.load_weights(loaded.weights)
    quantize_model(model, loaded.weights, loaded.quantized)
    config = EngineConfig(speculative_tokens=0, num_blocks=64, max_num_batched_tokens=256, max_model_len=512)
    engine = LLMEngine(model, config, frozenset())
    gen = torch.Generator().manual_seed(0)
    vocab = loaded.config.vocab_size
    decode = SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True)
    prefill, tg = [], []
    for rep in range(repetitions + 1):  # the first repetition warms up
        prompt = torch.randint(100, vocab, (128,), generator=gen).tolist()
        start = time.perf_counter()
        engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        prefill.append(128 / (time.perf_counter() - start))
        engine.add_request(f"tg-{rep}", engine.prompt(prompt[:1]), decode)
        engine.step()  # the one-token prefill and the first token
        start = time.perf_counter()
        for _ in range(32):
            engine.step()
        tg.append(32 / (time.perf_counter() - start))
        assert not engine.has_unfinished()
    return {"pp128_tok_s": statistics.median(prefill[1:]), "tg32_tok_s": statistics.median(tg[1:])}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench engine_alone", description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", help="a GGUF file (default: the shipped SmolLM2)")
    args = parser.parse_args(argv)
    for name, rate in engine_rates(args.threads, Path(args.model) if args.model else None).items():
        print(f"{name}: {rate:.1f}")
