"""Our engine vs transformers `generate()` on the same GGUF, dtype, prompts and threads, in one run.

Two measurements per side: batch-1 greedy decode tokens/s (time after the first token, so prefill is
excluded on both sides) and aggregate tokens/s for 8 concurrent requests (wall time, prefill included;
transformers gets one left-padded batch, which is its best case). EOS is ignored on both sides so every
request generates exactly `--max-new-tokens`. transformers + accelerate come from the `bench` extra.

    python -m bench backend_vs_hf --dtype bf16 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backend.loader import LoadedModel, default_model_path, load_model

RESULTS = Path(__file__).resolve().parent / "results"
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


async def ours(
    loaded: LoadedModel, dtype: torch.dtype, batch: list[list[int]], new_tokens: int
) -> dict[str, float]:
    from backend.engine.async_engine import AsyncEngine
    from backend.engine.config import EngineConfig
    from backend.engine.sampling_params import SamplingParams
    from backend.model.llama import LlamaModel

    model = LlamaModel(loaded.config, dtype=dtype)
    model.load_weights(loaded.weights)
    config = EngineConfig(num_blocks=512, max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024)
    engine = AsyncEngine(model, config, loaded.tokenizer.eos_token_ids)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    await engine.start()
    try:

        async def run(ids: list[int], rid: str) -> tuple[float, float, int]:
            start = time.perf_counter()
            first = 0.0
            count = 0
            async for _ in engine.generate(ids, params, rid):
                count += 1
                if count == 1:
                    first = time.perf_counter()
            return start, first, count

        await run(batch[0][:8], "warmup")
        decode = []
        for i, ids in enumerate(batch[:3]):
            _, first, count = await run(ids, f"b1-{i}")
            decode.append((count - 1) / (time.perf_counter() - first))
        start = time.perf_counter()
        results = await asyncio.gather(*(run(ids, f"c-{i}") for i, ids in enumerate(batch)))
        wall = time.perf_counter() - start
    finally:
        await engine.stop()
    return {
        "batch1_decode_tok_s": statistics.median(decode),
        "concurrent8_tok_s": sum(r[2] for r in results) / wall,
    }


def transformers_side(dtype: torch.dtype, batch: list[list[int]], new_tokens: int) -> dict[str, float]:
    import transformers

    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=dtype
    )
    model.eval()
    common = {"do_sample": False, "pad_token_id": 2, "eos_token_id": None}

    class FirstToken(transformers.generation.streamers.BaseStreamer):
        """generate() calls put() with the prompt, then once per new token: time the first new one."""

        def __init__(self) -> None:
            self.calls = 0
            self.first = 0.0

        def put(self, value: torch.Tensor) -> None:
            self.calls += 1
            if self.calls == 2:
                self.first = time.perf_counter()

        def end(self) -> None:
            pass

    def generate(ids: torch.Tensor, mask: torch.Tensor, n: int, streamer: FirstToken | None = None) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, streamer=streamer, **common
            )
        return time.perf_counter() - start

    one = torch.tensor([batch[0][:8]])
    generate(one, torch.ones_like(one), 4)  # warmup
    decode = []
    for ids in batch[:3]:
        t = torch.tensor([ids])
        streamer = FirstToken()
        generate(t, torch.ones_like(t), new_tokens, streamer)
        decode.append((new_tokens - 1) / (time.perf_counter() - streamer.first))
    width = max(len(ids) for ids in batch)
    padded = torch.tensor([[2] * (width - len(ids)) + ids for ids in batch])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
    wall = generate(padded, mask, new_tokens)
    return {
        "batch1_decode_tok_s": statistics.median(decode),
        "concurrent8_tok_s": len(batch) * new_tokens / wall,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads for both sides (0: torch default)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    loaded = load_model(None, progress=False)
    batch = prompts(loaded)
    mine = asyncio.run(ours(loaded, dtype, batch, args.max_new_tokens))
    theirs = transformers_side(dtype, batch, args.max_new_tokens)
    rows = [(key, mine[key], theirs[key], mine[key] / theirs[key]) for key in mine]
    print(
        f"\nSmolLM2-135M GGUF, {args.dtype}, {args.max_new_tokens} new tokens, {torch.get_num_threads()} threads"
    )
    print(f"{'metric':<22}{'tokenedge':>12}{'transformers':>14}{'ratio':>8}")
    for key, a, b, r in rows:
        print(f"{key:<22}{a:>12.1f}{b:>14.1f}{r:>7.2f}x")
    result: dict[str, Any] = {
        "benchmark": "backend_vs_hf",
        "dtype": args.dtype,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "tokenedge": mine,
        "transformers": theirs,
        "ratios": {key: r for key, _, _, r in rows},
        "targets": {"batch1_decode_tok_s": 1.5, "concurrent8_tok_s": 2.0},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"backend_vs_hf-{args.dtype}-{int(time.time())}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
