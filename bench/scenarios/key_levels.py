"""Benchmark: cache hit rate per key level on a mixed workload, and how many extra hits of `normalized` are wrong.

The workload is the committed key corpus (harness/data/key_corpus.json: whitespace, CRLF, NFC/NFD, zero-width,
content parts, default system prompt, key order, defaults, tools orderings) plus one JSON-only twin of every
variant (keys reordered, `temperature` spelled 0.0, a `user` field, `stream: false`). Requests arrive in order; the
first of a key misses and fills, every later one hits, and a hit serves the entry filled by the first. A hit is
*wrong* when the model (SmolLM2-135M, GGUF dequantized to fp32, greedy, 24 tokens, asked directly through the
engine) answers the request's own input ids differently from the input ids of the request that filled the entry.
Keys come from the gateway's own code (gateway/tokens/keyform.py, gateway/keys/derive.py) with SmolLM2's tokenizer.

`python -m bench key_levels [--no-model]` (--no-model: count hits whose input ids differ, without generating).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from typing import Any

from backend.tokenizer import Tokenizer
from bench.measure.load import write_results
from gateway.keys.derive import derive_key
from gateway.tokens.cache import TokenCache
from gateway.tokens.encoder import ModelEncoder
from gateway.tokens.keyform import canonical_form, model_input
from gateway.tokens.registry import spec_from_export
from harness.key_corpus import load, reordered

LEVELS = ("exact", "tokens", "normalized", "aggressive")
Request = tuple[str, dict[str, Any]]  # (endpoint, body)


def workload() -> list[Request]:
    out: list[Request] = []
    for group in load()["groups"].values():
        variants = [(group["endpoint"], body) for body in group["variants"]]
        out += variants
        out += [(endpoint, json_twin(body)) for endpoint, body in variants]
    return out


def json_twin(body: dict[str, Any]) -> dict[str, Any]:
    """The same request to the model, spelled differently as JSON only."""
    return reordered({**body, "temperature": 0.0, "user": "bench-user", "stream": False})


def key_of(level: str, endpoint: str, body: dict[str, Any], encoder: ModelEncoder) -> str:
    used, canonical = canonical_form("auto" if level == "tokens" else level, endpoint, body, encoder)
    assert used.value == level, (level, used)
    return derive_key(scope="pub", endpoint=endpoint, level=used, model_revision="r", canonical=canonical).key


def served_by(keys: list[str]) -> Iterator[tuple[int, int]]:
    """(request, the earlier request whose fill it is served from) for every hit, in arrival order."""
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key in first:
            yield i, first[key]
        else:
            first[key] = i


async def answers(
    tok: Tokenizer, prompts: list[tuple[int, ...]], max_tokens: int
) -> dict[tuple[int, ...], list[int]]:
    """Greedy continuations of every prompt, all submitted at once (the engine batches them)."""
    import torch

    from backend.engine.async_engine import AsyncEngine
    from backend.engine.config import EngineConfig
    from backend.engine.sampling_params import SamplingParams
    from backend.loader import load_model
    from backend.model.llama import LlamaModel

    loaded = load_model(None, progress=False)
    model = LlamaModel(loaded.config, dtype=torch.float32)
    model.load_weights(loaded.weights)
    engine = AsyncEngine(
        model,
        EngineConfig(
            speculative_tokens=0,
            num_blocks=1024,
            max_num_seqs=64,
            max_num_batched_tokens=2048,
            max_model_len=512,
        ),
        loaded.tokenizer.eos_token_ids,
    )
    await engine.start()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    async def run(i: int, ids: tuple[int, ...]) -> list[int]:
        return [t.token_id async for t in engine.generate(list(ids), params, f"bench-{i}")]

    try:
        outs = await asyncio.gather(*(run(i, ids) for i, ids in enumerate(prompts)))
    finally:
        await engine.stop()
    return dict(zip(prompts, outs, strict=True))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench key_levels")
    parser.add_argument("--no-model", action="store_true", help="count input-id mismatches only")
    args = parser.parse_args(argv)
    from backend.loader import default_model_path, gguf_tokenizer

    tok = gguf_tokenizer(default_model_path())
    encoder = ModelEncoder(spec_from_export(tok.export()), TokenCache(64 << 20))
    requests = workload()
    ids = [tuple(model_input(encoder, e, b) or ()) for e, b in requests]
    keys = {level: [key_of(level, e, b, encoder) for e, b in requests] for level in LEVELS}
    hits = {level: list(served_by(keys[level])) for level in LEVELS}
    differs = {level: [(i, j) for i, j in hits[level] if ids[i] != ids[j]] for level in LEVELS}
    wrong: dict[str, int | None] = dict.fromkeys(LEVELS)
    elapsed = 0.0
    if not args.no_model:
        prompts = sorted({ids[k] for level in LEVELS for pair in differs[level] for k in pair})
        started = time.perf_counter()
        outs = asyncio.run(answers(tok, prompts, 24))
        elapsed = time.perf_counter() - started
        wrong = {level: sum(outs[ids[i]] != outs[ids[j]] for i, j in differs[level]) for level in LEVELS}
    n = len(requests)
    print(
        f"\nKey levels on the mixed workload: {n} requests ({n // 2} corpus variants + their JSON-only twins)"
    )
    print(f"{'level':<12} {'hits':>6} {'hit rate':>9} {'input ids differ':>17} {'wrong answers':>14}")
    for level in LEVELS:
        w = "-" if wrong[level] is None else str(wrong[level])
        print(
            f"{level:<12} {len(hits[level]):>6} {len(hits[level]) / n:>8.1%} {len(differs[level]):>17} {w:>14}"
        )
    extra = len(hits["normalized"]) - len(hits["tokens"])
    print(
        f"normalized over tokens: {extra:+d} hits; wrong answers among normalized hits: {wrong['normalized']}"
        + (f" (model: SmolLM2 fp32 greedy 24 tokens, {elapsed:.0f} s)" if elapsed else "")
    )
    path = write_results(
        "key_levels",
        {
            "requests": n,
            "levels": {
                level: {
                    "hits": len(hits[level]),
                    "input_ids_differ": len(differs[level]),
                    "wrong": wrong[level],
                }
                for level in LEVELS
            },
        },
    )
    print(f"results: {path}")
