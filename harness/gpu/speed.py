"""The speed half of the GPU check (harness/gpu/check.py): decode tokens/s of the engine at batch 1 and 32 against
transformers `generate` on the same weights, and the share of the GPU's memory bandwidth the decode reaches.

Tokens/s count every generated token over the wall time of one `generate` of `new_tokens` per sequence (after a
warm-up run), prefill of the short prompts included on both sides. The bandwidth share divides the bytes a decode
step must read (every weight once, plus the KV cache at the mean context) by the step time and by the GPU's
measured device-to-device copy rate (a rate the GPU reaches, not the datasheet's).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from backend.engine.config import EngineConfig
from backend.model.llama import LlamaModel

if TYPE_CHECKING:
    from harness.gpu.check import Report

PROMPT_TOKENS = 32


def tiny_model(dtype: torch.dtype, device: str) -> LlamaModel:
    from harness.models.tiny import tiny_config, tiny_weights

    config = tiny_config()
    model = LlamaModel(config, dtype=dtype, device=device)
    model.load_weights(tiny_weights(config))
    return model


def speed_config(
    max_position: int,
    *,
    batch: int,
    new_tokens: int,
    block_size: int,
    device: str,
    attention: Any = "auto",
    batch_invariant: bool = True,
) -> EngineConfig:
    """An engine that holds `batch` sequences of PROMPT_TOKENS + new_tokens at once, its context inside the
    model's (a 2048-token context on the tiny model's 1024 positions was a ValueError before any measurement)."""
    need = PROMPT_TOKENS + new_tokens
    if need > max_position:
        raise ValueError(f"{need} tokens per sequence > the model's {max_position} positions")
    blocks = -(-need // block_size)
    return EngineConfig(
        speculative_tokens=0,
        block_size=block_size,
        num_blocks=batch * blocks + 1,
        max_num_seqs=batch,
        max_num_batched_tokens=max(512, batch),
        max_model_len=need,
        device=device,
        attention=attention,
        batch_invariant=batch_invariant,
    )


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def engine_tok_s(
    model: LlamaModel, config: EngineConfig, batch: int, new_tokens: int
) -> tuple[float, list[int]]:
    """(tokens/s, the first sequence's tokens) of the engine generating new_tokens for each of batch prompts."""
    from backend.engine.llm_engine import LLMEngine
    from backend.engine.sampling import SamplingParams

    engine = LLMEngine(model, config, frozenset())
    gen = torch.Generator().manual_seed(batch)
    prompts = [
        torch.randint(0, model.config.vocab_size, (PROMPT_TOKENS,), generator=gen).tolist()
        for _ in range(batch)
    ]
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    _sync(config.device)
    start = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    _sync(config.device)
    return batch * new_tokens / (time.perf_counter() - start), outs[0]


def transformers_tok_s(hf: Any, vocab: int, batch: int, new_tokens: int) -> tuple[float, list[int]]:
    """The same measurement through transformers `generate` (greedy, EOS ignored: exactly new_tokens each)."""
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, PROMPT_TOKENS), generator=gen).to(hf.device)
    mask = torch.ones_like(ids)
    kwargs = {"attention_mask": mask, "do_sample": False, "pad_token_id": 0}
    hf.generate(ids, max_new_tokens=2, min_new_tokens=2, **kwargs)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    torch.cuda.synchronize()
    return batch * new_tokens / (time.perf_counter() - start), out[0, PROMPT_TOKENS:].tolist()


def copy_bandwidth(device: str, mib: int = 1024) -> float | None:
    """Bytes/s of a device-to-device copy (read + write), median of 5; None off CUDA."""
    if device != "cuda":
        return None
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    rates = []
    for _ in range(6):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        rates.append(2 * src.numel() / (time.perf_counter() - start))
    return sorted(rates[1:])[2]


def step_bytes(model: LlamaModel, batch: int, mean_context: int) -> int:
    """What one decode step reads at least: every weight once, and each sequence's K and V so far."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    mc = model.config
    kv = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * model.dtype.itemsize * mean_context * batch
    return weights + kv


def load_smollm2(path: str | None, device: str) -> tuple[LlamaModel, Any, Path]:
    from backend.loader import default_model_path, load_model

    gguf = Path(path) if path else default_model_path()
    loaded = load_model(gguf, progress=False)
    model = LlamaModel(loaded.config, dtype=torch.bfloat16, device=device)
    model.load_weights(loaded.weights)
    return model, loaded, gguf


def transformers_model(gguf: Path, device: str) -> Any:
    """transformers on the same GGUF (it dequantizes the blocks as our loader does), bf16; None without it."""
    try:
        import transformers
    except ImportError:
        return None
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    return hf.to(device).eval()


def measure_speed(report: Report, device: str, args: argparse.Namespace, deadline: float) -> None:
    dry = bool(args.dry)
    batches, new_tokens = ((1,), 2) if dry else ((1, 32), 128)
    bandwidth = copy_bandwidth(device)
    report.facts["copy_bandwidth_gb_s"] = None if bandwidth is None else round(bandwidth / 1e9, 1)
    models: list[tuple[str, LlamaModel, Any]] = [
        ("tiny", tiny_model(torch.float32 if dry else torch.bfloat16, device), None)
    ]
    if not dry and not args.no_smollm2:
        model, loaded, gguf = load_smollm2(args.model, device)
        models.append((loaded.name, model, transformers_model(gguf, device)))
    for name, model, hf in models:
        for batch in batches:
            if time.perf_counter() > deadline:
                report.speed.append({"model": name, "batch": batch, "skipped": "over the time budget"})
                continue
            config = speed_config(
                model.config.max_position_embeddings, batch=batch, new_tokens=new_tokens, block_size=16,
                device=device, attention="triton" if dry else "auto", batch_invariant=not dry,
            )  # fmt: skip
            ours, our_tokens = engine_tok_s(model, config, batch, new_tokens)
            row: dict[str, Any] = {
                "model": name,
                "batch": batch,
                "new_tokens": new_tokens,
                "engine_tok_s": round(ours, 1),
            }
            # the same run with decode through CUDA graphs (backend/engine/cuda_graphs.py)
            if device == "cuda":
                graphed, graph_tokens = engine_tok_s(
                    model, replace(config, cuda_graphs=True), batch, new_tokens
                )
                row |= {
                    "engine_graphs_tok_s": round(graphed, 1),
                    "graphs_tokens_equal": graph_tokens == our_tokens,
                }
            if bandwidth is not None:
                read = step_bytes(model, batch, PROMPT_TOKENS + new_tokens // 2)
                row["bandwidth_fraction"] = round(read * ours / batch / bandwidth, 3)
            if hf is not None:
                theirs, their_tokens = transformers_tok_s(hf, model.config.vocab_size, batch, new_tokens)
                same = next(
                    (i for i, (a, b) in enumerate(zip(our_tokens, their_tokens, strict=False)) if a != b),
                    len(our_tokens),
                )
                row |= {
                    "transformers_tok_s": round(theirs, 1),
                    "speedup": round(ours / theirs, 2),
                    "greedy_tokens_agree": same,
                }
            print(row, flush=True)
            report.speed.append(row)
