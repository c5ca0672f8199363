"""CUDA check of the paged attention backends plus decode throughput; exits non-zero on any mismatch.

1. Random pools: flash-attn (if installed) and the SDPA torch-flash prefill path against the naive paged
   reference, bf16, GQA, block size 256 (flash) / 16 (SDPA), decode-only and mixed prefill+decode steps.
2. Engine: tiny fp32 model on CUDA (SDPA) equals `reference_logits`; tiny bf16 model with the auto backend
   stays close to its bf16 reference.
3. Decode tokens/s, batch 1 and batch 8, tiny model and (when the loader finds it) SmolLM2.
Run it through bench/gpu_check.sh.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from backend.attention.flash import flash_attn_available
from backend.attention.reference import reference_paged_attention
from backend.attention.sdpa import SdpaBackend
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.model.llama import LlamaModel
from tests.backend.test_attention import HEAD_DIM, HEADS, KV_HEADS, random_step
from tests.backend.test_paged_equivalence import LogitsSpy, assert_matches_reference
from tests.backend.tiny import tiny_config, tiny_weights

CASES = [([1, 1, 1, 1], [5, 300, 17, 700]), ([1, 1, 20, 7, 1], [1, 37, 20, 40, 16]), ([200, 1], [900, 513])]
FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        FAILURES.append(name)


def check_backends() -> None:
    backends: list[tuple[str, object, int]] = [
        ("sdpa+torch-flash", SdpaBackend(HEADS, KV_HEADS, HEAD_DIM, True), 16)
    ]
    if flash_attn_available():
        from backend.attention.flash import FlashBackend

        backends.append(("flash-attn", FlashBackend(HEADS, KV_HEADS, HEAD_DIM, 256), 256))
    else:
        print("flash-attn is not installed: only the SDPA paths are checked")
    for name, backend, block_size in backends:
        for query_lens, context_lens in CASES:
            num_blocks = sum(-(-c // block_size) for c in context_lens) + 2
            ctx, q, k, v, k_cache, v_cache = random_step(
                query_lens, context_lens, block_size, num_blocks, torch.bfloat16, "cuda"
            )
            out = backend.forward(q, k, v, k_cache, v_cache, backend.plan(ctx))  # type: ignore[attr-defined]
            expected = reference_paged_attention(q, k_cache, v_cache, ctx)
            err = (out.float() - expected.float()).abs().max().item()
            check(f"{name} q={query_lens} ctx={context_lens}", err < 2e-2, f"max|err|={err:.2e}")


def tiny_model(dtype: torch.dtype) -> LlamaModel:
    config = tiny_config()
    model = LlamaModel(config, dtype=dtype, device="cuda")
    model.load_weights(tiny_weights(config))
    return model


def check_engine() -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in (3, 40, 300, 90)]
    model = tiny_model(torch.float32)
    engine = LLMEngine(
        model,
        EngineConfig(speculative_tokens=0, num_blocks=64, max_model_len=512, device="cuda", attention="sdpa"),
        frozenset(),
    )
    spy = LogitsSpy(engine)
    engine.generate(prompts, params)
    try:
        assert_matches_reference(model, spy)
        check("engine fp32 sdpa == reference_logits", True)
    except AssertionError as exc:
        check("engine fp32 sdpa == reference_logits", False, str(exc).splitlines()[0])
    model = tiny_model(torch.bfloat16)
    block_size = 256 if flash_attn_available() else 16
    engine = LLMEngine(
        model,
        EngineConfig(
            speculative_tokens=0,
            block_size=block_size,
            num_blocks=4096 // block_size,
            max_model_len=1024,
            device="cuda",
        ),
        frozenset(),
    )
    spy = LogitsSpy(engine)
    engine.generate(prompts, params)
    worst = 0.0
    for seq, num_tokens, logits in spy.rows:
        expected = model.reference_logits(torch.tensor(seq.token_ids[:num_tokens]))[-1]
        worst = max(worst, (logits - expected).abs().max().item())
    check(
        f"engine bf16 {engine.attention.name} ~ bf16 reference_logits", worst < 0.15, f"max|err|={worst:.3f}"
    )


def decode_tps(model: LlamaModel, batch: int, new_tokens: int, block_size: int) -> float:
    config = EngineConfig(
        speculative_tokens=0,
        block_size=block_size,
        num_blocks=max(64, 8192 // block_size),
        max_num_seqs=16,
        max_model_len=2048,
        device="cuda",
    )
    engine = LLMEngine(model, config, frozenset())
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    prompts = [torch.randint(0, model.config.vocab_size, (32,)).tolist() for _ in range(batch)]
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.generate(prompts, params)
    torch.cuda.synchronize()
    return batch * new_tokens / (time.perf_counter() - start)


def report_speed(smollm2: bool) -> None:
    block_size = 256 if flash_attn_available() else 16
    models = [("tiny bf16", tiny_model(torch.bfloat16))]
    if smollm2:
        try:
            from backend.loader import load_model

            loaded = load_model(progress=False)
            model = LlamaModel(loaded.config, dtype=torch.bfloat16, device="cuda")
            model.load_weights(loaded.weights)
            models.append((f"{loaded.name} bf16", model))
        except Exception as exc:  # the default model is optional here
            print(f"SmolLM2 skipped: {exc!r}")
    for name, model in models:
        for batch in (1, 8):
            print(
                f"decode {name} batch={batch} block={block_size}: {decode_tps(model, batch, 128, block_size):.1f} tokens/s"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-smollm2", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    torch.manual_seed(0)
    print(
        f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  flash-attn: {flash_attn_available()}"
    )
    check_backends()
    check_engine()
    report_speed(smollm2=not args.no_smollm2)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) FAILED: {FAILURES}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
