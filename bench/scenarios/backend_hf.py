"""Our engine vs transformers `generate()` and llama.cpp on the same GGUF, prompts and threads, in one run.

All sides are loaded together and measured in alternating rounds (medians reported), since the
machine is shared. Measurements: batch-1 greedy decode tokens/s (time after the first token, so prefill is
excluded on every side); aggregate tokens/s for 8 concurrent requests (wall time, prefill included;
transformers gets one left-padded batch, its best case; llama.cpp's Python API serves one sequence at a
time, so its batch-1 rate is its aggregate); prefill tokens/s of a 250-token prompt (a new prompt each
round, so no prefix cache helps). EOS is ignored so every request generates exactly `--max-new-tokens`.
Ours runs `--weights quantized` (the default: int4 blocks as shipped) unless told otherwise; transformers
runs `--dtype`; llama.cpp runs the GGUF's own Q4_1 (built once into bench/.venv-llamacpp, see
harness/peers/llamacpp_python.py). transformers + accelerate come from the `bench` extra.

    python -m bench backend_hf --max-new-tokens 64 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backend.kernels.load import int4_kernel
from backend.loader import LoadedModel, default_model_path, load_model
from bench.measure.engine import DTYPES, prefill_prompts, prompts
from bench.measure.load import write_results
from harness.peers.llamacpp_python import LlamaCpp

# a peer: our engine with torch's int4 kernel instead of the AMX one (`--peers ... torch-int4`)
TORCH_INT4 = "torch-int4"
METRICS = ("batch1_decode_tok_s", "concurrent8_tok_s", "prefill250_tok_s")


class Ours:
    """Our engine behind the same two measurements; started once, measured in every round."""

    def __init__(
        self,
        loaded: LoadedModel,
        dtype: torch.dtype,
        new_tokens: int,
        weights: str,
        kernel: str | None = None,
    ) -> None:
        from backend.engine.async_engine import AsyncEngine
        from backend.engine.config import EngineConfig
        from backend.engine.sampling_params import SamplingParams
        from backend.model.llama import LlamaModel
        from backend.model.quant import quantize_model

        model = LlamaModel(loaded.config, dtype=dtype)
        model.load_weights(loaded.weights)
        if weights == "quantized":
            quantize_model(model, loaded.weights, loaded.quantized, kernel)
        config = EngineConfig(
            speculative_tokens=0,
            num_blocks=512,
            max_num_seqs=8,
            max_num_batched_tokens=1024,
            max_model_len=1024,
        )
        self.engine = AsyncEngine(model, config, loaded.tokenizer.eos_token_ids)
        self.params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        self.requests = 0

    async def _run(self, ids: list[int]) -> tuple[float, int]:
        self.requests += 1
        first, count = 0.0, 0
        async for _ in self.engine.generate(self.engine.prompt(ids), self.params, f"bench-{self.requests}"):
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

    async def prefill(self, ids: list[int]) -> float:
        from backend.engine.sampling_params import SamplingParams

        self.requests += 1
        start = time.perf_counter()
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        async for _ in self.engine.generate(self.engine.prompt(ids), one, f"bench-{self.requests}"):
            pass
        return len(ids) / (time.perf_counter() - start)


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

    def prefill(self, ids: list[int]) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            self.model(torch.tensor([ids]))
        return len(ids) / (time.perf_counter() - start)

    def concurrent(self, batch: list[list[int]]) -> float:
        width = max(len(ids) for ids in batch)
        padded = torch.tensor([[2] * (width - len(ids)) + ids for ids in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        start = time.perf_counter()
        self._generate(padded, mask)
        return len(batch) * self.new_tokens / (time.perf_counter() - start)


async def measure(loaded: LoadedModel, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Alternate the sides round by round and keep medians: the machine is shared and noisy."""
    batch, fills = prompts(loaded), prefill_prompts(loaded, args.rounds)
    new_tokens = args.max_new_tokens
    ours = Ours(loaded, DTYPES[args.dtype], new_tokens, args.weights)
    # ours again on torch's int4 kernel: the same engine, only the 4-bit matmul differs (the AMX kernel's A/B)
    torch_int4 = (
        Ours(loaded, DTYPES[args.dtype], new_tokens, args.weights, "torch")
        if TORCH_INT4 in args.peers
        else None
    )
    theirs = Transformers(DTYPES[args.dtype], new_tokens) if "transformers" in args.peers else None
    cpp = LlamaCpp(default_model_path(), torch.get_num_threads()) if "llamacpp" in args.peers else None
    samples: dict[str, dict[str, list[float]]] = {}

    def add(side: str, metric: str, value: float) -> None:
        samples.setdefault(side, {}).setdefault(metric, []).append(value)

    sides = [("tokenedge", ours)] + ([(TORCH_INT4, torch_int4)] if torch_int4 is not None else [])
    for _, side in sides:
        await side.engine.start()
    try:
        for _, side in sides:
            await side.batch1(batch[0][:8])  # warmups
            await side.prefill(fills[-1])
        if theirs is not None:
            theirs.batch1(batch[0][:8])
        for r in range(args.rounds):
            ids = batch[r % len(batch)]
            for name, side in sides:
                add(name, "batch1_decode_tok_s", await side.batch1(ids))
            if theirs is not None:
                add("transformers", "batch1_decode_tok_s", theirs.batch1(ids))
            if cpp is not None:
                add("llama.cpp", "batch1_decode_tok_s", cpp.batch1(ids, new_tokens))
            for name, side in sides:
                add(name, "concurrent8_tok_s", await side.concurrent(batch))
            if theirs is not None:
                add("transformers", "concurrent8_tok_s", theirs.concurrent(batch))
            for name, side in sides:
                add(name, "prefill250_tok_s", await side.prefill(fills[r]))
            if theirs is not None:
                add("transformers", "prefill250_tok_s", theirs.prefill(fills[r]))
            if cpp is not None:
                add("llama.cpp", "prefill250_tok_s", cpp.prefill(fills[r]))
    finally:
        for _, side in sides:
            await side.engine.stop()
        if cpp is not None:
            cpp.close()
    medians = {side: {k: statistics.median(v) for k, v in m.items()} for side, m in samples.items()}
    if cpp is not None:  # llama.cpp's Python API runs one sequence at a time
        medians["llama.cpp"]["concurrent8_tok_s"] = medians["llama.cpp"]["batch1_decode_tok_s"]
        medians["llama.cpp"]["build"] = cpp.build  # type: ignore[assignment]
    return medians


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next(
        (ln.partition(":")[2].strip() for ln in text.splitlines() if ln.startswith("model name")), "?"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--weights", choices=("quantized", "dequantized"), default="quantized")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch and llama.cpp threads (0: torch default)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    parser.add_argument(
        "--peers",
        nargs="*",
        default=["transformers", "llamacpp"],
        help=f"any of transformers llamacpp {TORCH_INT4}",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(None, progress=False)
    medians = asyncio.run(measure(loaded, args))
    ours = medians["tokenedge"]
    peers = [side for side in ("llama.cpp", "transformers", TORCH_INT4) if side in medians]
    print(
        f"\nSmolLM2-135M GGUF, ours --weights {args.weights} (bf16 activations, int4 kernel {int4_kernel()}), "
        f"peers {args.dtype} / Q4_1, "
        f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} threads, {cpu_model()}"
    )
    header = f"{'metric':<22}{'tokenedge':>11}" + "".join(f"{p:>14}{'ratio':>8}" for p in peers)
    print(header)
    for key in METRICS:
        row = f"{key:<22}{ours[key]:>11.1f}"
        for p in peers:
            row += f"{medians[p][key]:>14.1f}{ours[key] / medians[p][key]:>7.2f}x"
        print(row)
    if "llama.cpp" in medians:
        print(f"llama.cpp build: {medians['llama.cpp'].get('build')}")
    result: dict[str, Any] = {
        "benchmark": "backend",
        "weights": args.weights,
        "dtype": args.dtype,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "int4_kernel": int4_kernel(),
        "medians": medians,
    }
    print(f"wrote {write_results(f'backend-{args.weights}-{int(time.time())}', result)}")


if __name__ == "__main__":
    main()
