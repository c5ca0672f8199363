"""A tiny random-weight Llama for fast engine and server tests (fp32 by default, HF weight names)."""

from __future__ import annotations

import dataclasses

import torch

from backend.model.config import LlamaConfig
from backend.model.llama import LlamaModel
from backend.tokenizer import Tokenizer
from tokenedge_wire.pattern import GPT2


def tiny_config(tie_word_embeddings: bool = True) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=1024,
        tie_word_embeddings=tie_word_embeddings,
    )


def unaligned_config() -> LlamaConfig:
    """The tiny config with widths whose rows are no multiple of 16 bytes in fp32 (hidden 37, intermediate 99,
    head_dim 14): rows and head vectors of a call start at addresses that depend on their place in it."""
    return dataclasses.replace(
        tiny_config(), hidden_size=37, intermediate_size=99, num_heads=3, num_kv_heads=1, head_dim=14
    )


def tiny_weights(config: LlamaConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 weights under their Hugging Face names, scaled so logits are well spread."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    def norm_weight() -> torch.Tensor:
        return 1.0 + rand(config.hidden_size, scale=0.1)

    h, i = config.hidden_size, config.intermediate_size
    q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    weights = {
        "model.embed_tokens.weight": rand(config.vocab_size, h, scale=0.25),
        "model.norm.weight": norm_weight(),
    }
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        weights |= {
            p + "input_layernorm.weight": norm_weight(),
            p + "post_attention_layernorm.weight": norm_weight(),
            p + "self_attn.q_proj.weight": rand(q_dim, h, scale=0.25),
            p + "self_attn.k_proj.weight": rand(kv_dim, h, scale=0.25),
            p + "self_attn.v_proj.weight": rand(kv_dim, h),
            p + "self_attn.o_proj.weight": rand(h, q_dim),
            p + "mlp.gate_proj.weight": rand(i, h),
            p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
        }
    if not config.tie_word_embeddings:
        weights["lm_head.weight"] = rand(config.vocab_size, h, scale=0.25)
    return weights


def tiny_model(
    seed: int = 0, dtype: torch.dtype = torch.float32, tie_word_embeddings: bool = True, device: str = "cpu"
) -> LlamaModel:
    """A random-weight model. Sets torch to one intra-op thread: at this size extra threads only add
    synchronisation cost, and tests share a small machine."""
    torch.set_num_threads(1)
    config = tiny_config(tie_word_embeddings)
    model = LlamaModel(config, dtype=dtype, device=device)
    model.load_weights(tiny_weights(config, seed))
    return model


def byte_tokenizer(chat_template: str, eos: int = 0) -> Tokenizer:
    """Bytes as tokens (vocab 256, fits the tiny model), byte `eos` as EOS, and the given chat template."""
    return Tokenizer(
        name="bytes",
        pattern=GPT2,
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={},
        vocab_size=256,
        bos_token_id=None,
        eos_token_ids=[eos],
        chat_template=chat_template,
    )
