"""Our engine vs transformers `generate()` on the same GGUF, dtype, prompts and threads, in one run.

Both sides are loaded together and measured in alternating rounds (medians reported), since the
machine is shared. Two measurements per side: batch-1 greedy decode tokens/s (time after the first token, so prefill is
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


class Ours:
    """Our engine behind the same two measurements; started once, measured in every round."""

    def __init__(self, loaded: LoadedModel, dtype: torch.dtype, new_tokens: int) -> None:
        from backend.engine.async_engine import AsyncEngine
        from backend.engine.config import EngineConfig
        from backend.engine.sampling_params import SamplingParams
        from backend.model.llama import LlamaModel

        model = LlamaModel(loaded.config, dtype=dtype)
        model.load_weights(loaded.weights)
        config = EngineConfig(num_blocks=512, max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024)
        self.engine = AsyncEngine(model, config, loaded.tokenizer.eos_token_ids)
        self.params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        self.requests = 0

    async def _run(self, ids: list[int]) -> tuple[float, int]:
        self.requests += 1
        first, count = 0.0, 0
        async for _ in self.engine.generate(ids, self.params, f"bench-{self.requests}"):
            count += 1
            if count == 1:
                first = time.perf_counter()
        return first, count

    async def batch1(self, ids: list[int]) -> float:
        first, count = await self._run(ids)
        return (count - 1) / (time.perf_counter() - first)

    async def concurrent(self, batch: list[list[int]]) -> float:
        start = time.perf_counter()
        results = await asyncio.gather(*(self._run(ids) for ids in batch))
        return sum(count for _, count in results) / (time.perf_counter() - start)


class Transformers:
    """transformers `generate()` on the same GGUF (left-padded batch for the concurrent case)."""

    def __init__(self, dtype: torch.dtype, new_tokens: int) -> None:
        import transformers

        path = default_model_path()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype
        )
        self.model.eval()
        self.new_tokens = new_tokens

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

        self.streamer_type = FirstToken

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, streamer: Any = None) -> None:
        with torch.no_grad():
            self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=self.new_tokens,
                min_new_tokens=self.new_tokens,
                do_sample=False,
                pad_token_id=2,
                eos_token_id=None,
                streamer=streamer,
            )

    def batch1(self, ids: list[int]) -> float:
        t = torch.tensor([ids])
        streamer = self.streamer_type()
        self._generate(t, torch.ones_like(t), streamer)
        return (self.new_tokens - 1) / (time.perf_counter() - streamer.first)

    def concurrent(self, batch: list[list[int]]) -> float:
        width = max(len(ids) for ids in batch)
        padded = torch.tensor([[2] * (width - len(ids)) + ids for ids in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        start = time.perf_counter()
        self._generate(padded, mask)
        return len(batch) * self.new_tokens / (time.perf_counter() - start)


async def measure(
    loaded: LoadedModel, dtype: torch.dtype, new_tokens: int, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Alternate the two sides round by round and keep medians: the machine is shared and noisy."""
    batch = prompts(loaded)
    ours, theirs = Ours(loaded, dtype, new_tokens), Transformers(dtype, new_tokens)
    samples: dict[str, dict[str, list[float]]] = {
        side: {"batch1_decode_tok_s": [], "concurrent8_tok_s": []} for side in ("ours", "theirs")
    }
    await ours.engine.start()
    try:
        await ours.batch1(batch[0][:8])  # warmups
        theirs.batch1(batch[0][:8])
        for r in range(rounds):
            ids = batch[r % len(batch)]
            samples["ours"]["batch1_decode_tok_s"].append(await ours.batch1(ids))
            samples["theirs"]["batch1_decode_tok_s"].append(theirs.batch1(ids))
            samples["ours"]["concurrent8_tok_s"].append(await ours.concurrent(batch))
            samples["theirs"]["concurrent8_tok_s"].append(theirs.concurrent(batch))
    finally:
        await ours.engine.stop()
    medians = {side: {k: statistics.median(v) for k, v in m.items()} for side, m in samples.items()}
    return medians["ours"], medians["theirs"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads for both sides (0: torch default)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    loaded = load_model(None, progress=False)
    mine, theirs = asyncio.run(measure(loaded, dtype, args.max_new_tokens, args.rounds))
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
        "rounds": args.rounds,
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
