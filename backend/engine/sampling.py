"""The sampler (SamplingParams is re-exported from sampling_params): greedy, temperature, top-k, top-p, per-request seeded generators.

Each sequence owns its torch.Generator and is sampled on its own row, so a seeded request draws the same
tokens whatever else shares the batch. Greedy rows (temperature ~0, see `SamplingParams.greedy`) take one
batched argmax.
"""

from __future__ import annotations

import random
from collections.abc import Sequence as Seq

import torch

from backend.engine.sampling_params import SamplingParams

__all__ = ["SamplingParams", "make_generator", "sample"]


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """The sequence's own generator; None for greedy requests, a random seed when none was given."""
    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else random.getrandbits(63)
    return torch.Generator(device=device).manual_seed(seed)


def sample(
    logits: torch.Tensor, params: Seq[SamplingParams], generators: Seq[torch.Generator | None]
) -> list[int]:
    """One token per row. logits: [N, vocab] fp32."""
    assert logits.dim() == 2 and logits.shape[0] == len(params) == len(generators)
    tokens = logits.argmax(dim=-1).tolist()  # greedy for every row, overwritten for sampled rows
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            assert gen is not None, "a sampled request needs its generator"
            tokens[row] = _sample_row(logits[row], p, gen)
    return tokens


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    # logits: [vocab] fp32
    scaled = logits.float() / params.temperature
    if 0 < params.top_k < scaled.shape[0]:  # top_k 0 or -1: disabled
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)  # [vocab]
        sorted_probs = sorted_logits.softmax(dim=-1)
        # drop a token when the tokens strictly before it already cover top_p; the first always stays
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) > params.top_p
        scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = scaled.softmax(dim=-1)  # [vocab]
    return int(torch.multinomial(probs, 1, generator=generator).item())
