"""Teacher-forced top-1 agreement with the fp32 dequantized reference on the committed 2,000-token corpus:
our quantized default vs llama.cpp on the same GGUF (its own Q4_1 kernels), in one run.

    python -m bench agreement --threads 2
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from backend.loader import LoadedModel, default_model_path, load_model
from backend.model.llama import LlamaModel, _causal_attention
from backend.model.quant import quantize_model
from harness.peers.llamacpp_python import LlamaCpp

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "backend" / "data" / "agreement_corpus.json"


def agreement(loaded: LoadedModel, with_llamacpp: bool, threads: int) -> dict[str, float]:
    reference = LlamaModel(loaded.config, dtype=torch.float32)
    reference.load_weights(loaded.weights)
    ours = LlamaModel(loaded.config, dtype=torch.bfloat16)
    ours.load_weights(loaded.weights)
    quantize_model(ours, loaded.weights, loaded.quantized)
    cpp = LlamaCpp(default_model_path(), threads) if with_llamacpp else None
    agree = {"tokenedge": 0, "llama.cpp": 0}
    total = 0
    try:
        for text in json.loads(CORPUS.read_text())["documents"]:
            ids = loaded.tokenizer.encode(text)
            expected = reference.reference_logits(torch.tensor(ids)).argmax(dim=-1)[:-1]
            hidden = ours(
                torch.tensor(ids), torch.arange(len(ids)), lambda _i, q, k, v: _causal_attention(q, k, v)
            )
            got = ours.compute_logits(hidden, greedy=[True] * len(ids)).argmax(dim=-1)[:-1]
            agree["tokenedge"] += int((got == expected).sum())
            if cpp is not None:
                theirs = torch.tensor(cpp.argmax(ids))[:-1]
                agree["llama.cpp"] += int((theirs == expected).sum())
            total += len(ids) - 1
    finally:
        if cpp is not None:
            cpp.close()
    return {
        side: count / total for side, count in agree.items() if side == "tokenedge" or cpp is not None
    } | {"tokens": total}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-llamacpp", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = agreement(load_model(None, progress=False), not args.no_llamacpp, args.threads)
    print(f"\ntop-1 agreement with the fp32 dequantized reference over {int(result['tokens'])} tokens")
    for side, value in result.items():
        if side != "tokens":
            print(f"{side:<12}{value:>8.2%}")


if __name__ == "__main__":
    main()
