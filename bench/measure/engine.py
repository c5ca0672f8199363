"""The backend scenarios' shared parts: their prompts (chat questions through the model's template, and prefill
prompts cut from the agreement corpus) and our engine alone measured as `llama-bench` measures llama.cpp (tg32 and
pp128: see bench/scenarios/engine_alone.py)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.loader import LoadedModel, load_model
from backend.model.llama import LlamaModel
from backend.model.quant import quantize_model

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "backend" / "data" / "agreement_corpus.json"
PREFILL_TOKENS = 250
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a hash table is.",
    "Give three tips for learning to cook.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What are prime numbers?",
    "How do vaccines work?",
]


def prompts(loaded: LoadedModel) -> list[list[int]]:
    tok = loaded.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]


def prefill_prompts(loaded: LoadedModel, rounds: int, length: int = PREFILL_TOKENS) -> list[list[int]]:
    """A different `length`-token prompt per round (different from the first token on: no prefix hits)."""
    text = " ".join(json.loads(CORPUS.read_text())["documents"])
    ids = loaded.tokenizer.encode(text)
    return [ids[r * 7 : r * 7 + length] for r in range(rounds + 1)]


def quantized_engine(
    threads: int, model_path: Path | None, config: EngineConfig
) -> tuple[LoadedModel, LLMEngine]:
    """The model (the shipped one unless `model_path`) as served on a CPU, bf16 with its 4-bit weights, under
    `config`, on `threads` torch threads."""
    torch.set_num_threads(threads)
    loaded = load_model(model_path, progress=False)
    model = LlamaModel(loaded.config, dtype=torch.bfloat16)
    model.load_weights(loaded.weights)
    quantize_model(model, loaded.weights, loaded.quantized)
    return loaded, LLMEngine(model, config, frozenset())


def engine_rates(threads: int, model_path: Path | None = None, repetitions: int = 5) -> dict[str, float]:
    """{'pp128_tok_s', 'tg32_tok_s'}: medians over `repetitions`, `threads` torch threads; the shipped model
    unless `model_path` names another GGUF."""
    config = EngineConfig(speculative_tokens=0, num_blocks=64, max_num_batched_tokens=256, max_model_len=512)
    loaded, engine = quantized_engine(threads, model_path, config)
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


def depth_rates(
    threads: int, depths: list[int], model_path: Path | None = None, repetitions: int = 3
) -> dict[int, float]:
    """{depth: tg32 tok/s}: 32 greedy decode steps after a `depth`-token context (`llama-bench -d depth -n 32`),
    medians over `repetitions`, a new random context each time (no prefix cache); the prefill is not timed."""
    config = EngineConfig(speculative_tokens=0, max_num_batched_tokens=512, max_model_len=max(depths) + 64)
    loaded, engine = quantized_engine(threads, model_path, config)
    gen = torch.Generator().manual_seed(0)
    decode = SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True)
    rates: dict[int, float] = {}
    for depth in depths:
        tg = []
        for rep in range(repetitions + 1):  # the first repetition warms up
            context = torch.randint(100, loaded.config.vocab_size, (max(depth, 1),), generator=gen).tolist()
            engine.add_request(f"d{depth}-{rep}", engine.prompt(context), decode)
            while engine.step() == []:  # the context's prefill, in chunks, to its first token
                pass
            start = time.perf_counter()
            for _ in range(32):
                engine.step()
            tg.append(32 / (time.perf_counter() - start))
            assert not engine.has_unfinished()
        rates[depth] = statistics.median(tg[1:])
    return rates
