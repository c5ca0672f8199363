"""What batch invariance costs: our engine with `batch_invariant` on and off, same model, same run.

Three measurements per side, in alternating rounds (medians reported; the machine is shared):
batch-1 greedy decode tokens/s (after the first token), aggregate tokens/s of 8 requests sent together
(prefill included), and prefill tokens/s of a ~250-token prompt (time to its first token). Prefix caching is
off so every round really prefills. The cost is 1 - on/off; targets: <= 10% at batch 1, <= 25% at 8.

    python -m bench backend_invariance --dtype bf16 --max-new-tokens 64 --rounds 5
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.loader import LoadedModel, load_model
from backend.model.llama import LlamaModel
from bench.measure.engine import DTYPES, prompts
from bench.measure.load import write_results

PREFILL_TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm windowsill. "
TARGETS = {"batch1_decode_tok_s": 0.10, "concurrent8_tok_s": 0.25}


class Side:
    """One engine over the shared model; each measurement uses fresh request ids."""

    def __init__(self, model: LlamaModel, eos: frozenset[int], invariant: bool, new_tokens: int) -> None:
        config = EngineConfig(
            speculative_tokens=0,
            num_blocks=512,
            max_num_seqs=8,
            max_num_batched_tokens=1024,
            max_model_len=1024,
            enable_prefix_caching=False,
            batch_invariant=invariant,
        )
        self.engine = LLMEngine(model, config, eos)
        self.params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        self.count = 0

    def _add(self, ids: list[int], params: SamplingParams) -> None:
        self.count += 1
        self.engine.add_request(f"bench-{self.count}", self.engine.prompt(ids), params)

    def batch1(self, ids: list[int]) -> float:
        self._add(ids, self.params)
        self.engine.step()  # prefill + first token
        start, tokens = time.perf_counter(), 0
        while self.engine.has_unfinished():
            tokens += len(self.engine.step())
        return tokens / (time.perf_counter() - start)

    def concurrent(self, batch: list[list[int]]) -> float:
        start, tokens = time.perf_counter(), 0
        for ids in batch:
            self._add(ids, self.params)
        while self.engine.has_unfinished():
            tokens += len(self.engine.step())
        return tokens / (time.perf_counter() - start)

    def prefill(self, ids: list[int]) -> float:
        self._add(ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        start = time.perf_counter()
        while self.engine.has_unfinished():
            self.engine.step()
        return len(ids) / (time.perf_counter() - start)


def measure(loaded: LoadedModel, dtype: torch.dtype, new_tokens: int, rounds: int) -> dict[str, Any]:
    model = LlamaModel(loaded.config, dtype=dtype)
    model.load_weights(loaded.weights)
    start = time.perf_counter()
    model.calibrate_invariance()
    calibration_s = time.perf_counter() - start
    eos = loaded.tokenizer.eos_token_ids
    sides = {"on": Side(model, eos, True, new_tokens), "off": Side(model, eos, False, new_tokens)}
    batch = prompts(loaded)
    long_ids = loaded.tokenizer.encode(PREFILL_TEXT * 16)[:250]
    keys = ("batch1_decode_tok_s", "concurrent8_tok_s", "prefill_tok_s")
    samples: dict[str, dict[str, list[float]]] = {s: {k: [] for k in keys} for s in sides}
    for side in sides.values():  # warmup: first calls build kernels
        side.batch1(batch[0][:8])
    for r in range(rounds):
        order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
        for name, side in order:
            samples[name]["batch1_decode_tok_s"].append(side.batch1(batch[r % len(batch)]))
            samples[name]["concurrent8_tok_s"].append(side.concurrent(batch))
            samples[name]["prefill_tok_s"].append(side.prefill(long_ids[r:] + long_ids[:r]))
    medians = {s: {k: statistics.median(v) for k, v in m.items()} for s, m in samples.items()}
    return {"medians": medians, "samples": samples, "calibration_s": calibration_s, "tilings": model.tilings}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are reported")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(None, progress=False)
    result = measure(loaded, DTYPES[args.dtype], args.max_new_tokens, args.rounds)
    on, off = result["medians"]["on"], result["medians"]["off"]
    print(
        f"\nSmolLM2-135M GGUF, {args.dtype}, {args.max_new_tokens} new tokens, {torch.get_num_threads()} threads, "
        f"{args.rounds} rounds; tiling calibration {result['calibration_s']:.1f} s"
    )
    print(f"{'metric':<22}{'invariant':>12}{'off':>10}{'cost':>8}{'target':>8}")
    for key in on:
        target = f"{TARGETS[key]:.0%}" if key in TARGETS else "-"
        print(f"{key:<22}{on[key]:>12.1f}{off[key]:>10.1f}{1 - on[key] / off[key]:>8.1%}{target:>8}")
    for name, tiling in result["tilings"].items():
        print(f"  {name}: tiles of {tiling.tile_rows} rows, at least {tiling.min_rows}")
    record = {
        "benchmark": "backend_invariance",
        "dtype": args.dtype,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "invariant": on,
        "off": off,
        "cost": {k: 1 - on[k] / off[k] for k in on},
        "targets": TARGETS,
        "calibration_s": result["calibration_s"],
        "tilings": {n: [t.tile_rows, t.min_rows] for n, t in result["tilings"].items()},
    }
    print(f"wrote {write_results(f'backend_invariance-{args.dtype}-{int(time.time())}', record)}")


if __name__ == "__main__":
    main()
