"""LlamaModel: weight loading by HF names, fp32 residual/logits with bf16 weights, both RoPE layouts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.model.config import Llama3RopeScaling, LlamaConfig
from backend.model.llama import LlamaModel
from backend.model.rope import RopeTable, apply_rope, inv_frequencies
from harness.models.tiny import tiny_config, tiny_model, tiny_weights

TOKENS = torch.tensor([3, 141, 59, 26, 5, 35, 89, 79, 32, 38])


def test_reference_logits_are_fp32_and_causal() -> None:
    model = tiny_model()
    logits = model.reference_logits(TOKENS)
    assert logits.shape == (10, 256) and logits.dtype == torch.float32
    torch.testing.assert_close(model.reference_logits(TOKENS[:6]), logits[:6], atol=1e-5, rtol=0)


def test_bf16_weights_keep_an_fp32_residual_and_fp32_logits() -> None:
    fp32 = tiny_model().reference_logits(TOKENS)
    bf16_model = tiny_model(dtype=torch.bfloat16)
    bf16 = bf16_model.reference_logits(TOKENS)
    assert bf16_model.embed_tokens.weight.dtype == torch.bfloat16
    assert bf16.dtype == torch.float32
    # fp32 logits: no bf16 rounding grid (a bf16 output would repeat values at ~3 significant digits)
    assert bf16.unique().numel() > 0.99 * bf16.numel()
    assert (bf16 - fp32).abs().max() < 0.25


def test_untied_head_uses_lm_head_weight() -> None:
    tied = tiny_model(tie_word_embeddings=True).reference_logits(TOKENS)
    untied = tiny_model(tie_word_embeddings=False).reference_logits(TOKENS)
    assert untied.shape == tied.shape and not torch.allclose(tied, untied)


def test_load_weights_rejects_missing_unexpected_and_misshapen() -> None:
    config = tiny_config()
    weights = tiny_weights(config)
    model = LlamaModel(config, dtype=torch.float32)
    with pytest.raises(ValueError, match="missing"):
        model.load_weights({k: v for k, v in weights.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match="unexpected"):
        model.load_weights({**weights, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        model.load_weights({**weights, "model.norm.weight": torch.ones(3)})
    model.load_weights({**weights, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)})


def _gguf_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's convert permutation of Q/K rows (rotate-half pairs -> adjacent pairs)."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def test_interleaved_rope_on_permuted_weights_equals_rotate_half() -> None:
    config = tiny_config()
    weights = tiny_weights(config)
    permuted = dict(weights)
    for name, tensor in weights.items():
        if name.endswith("q_proj.weight"):
            permuted[name] = _gguf_permute(tensor, config.num_heads)
        elif name.endswith("k_proj.weight"):
            permuted[name] = _gguf_permute(tensor, config.num_kv_heads)
    interleaved = LlamaModel(dataclasses.replace(config, rope_interleaved=True), dtype=torch.float32)
    interleaved.load_weights(permuted)
    torch.testing.assert_close(
        interleaved.reference_logits(TOKENS), tiny_model().reference_logits(TOKENS), atol=1e-4, rtol=0
    )


def test_llama3_rope_scaling_slows_only_low_frequencies() -> None:
    plain = inv_frequencies(64, 500000.0, None)
    scaled = inv_frequencies(64, 500000.0, Llama3RopeScaling(8.0, 1.0, 4.0, 8192))
    assert scaled[0] == plain[0]
    torch.testing.assert_close(scaled[-1], plain[-1] / 8.0)


def _plain_llama(weights: dict[str, torch.Tensor], config: LlamaConfig, tokens: torch.Tensor) -> torch.Tensor:
    """An independent fp32 Llama straight from the HF formulas and weight names: logits [T, vocab]."""
    w = weights
    t, h, d = tokens.shape[0], config.num_heads, config.head_dim
    kh = config.num_kv_heads

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) * weight

    def rope(x: torch.Tensor) -> torch.Tensor:  # x: [heads, T, D], rotate_half
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2).float() / d))
        ang = torch.cat([torch.outer(torch.arange(t).float(), inv)] * 2, dim=-1)  # [T, D]
        rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
        return x * ang.cos() + rot * ang.sin()

    x = w["model.embed_tokens.weight"][tokens]
    causal = torch.ones(t, t).tril().bool()
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = rope((a @ w[p + "self_attn.q_proj.weight"].T).view(t, h, d).transpose(0, 1))
        k = rope((a @ w[p + "self_attn.k_proj.weight"].T).view(t, kh, d).transpose(0, 1))
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(t, kh, d).transpose(0, 1)
        k, v = k.repeat_interleave(h // kh, 0), v.repeat_interleave(h // kh, 0)
        scores = (q @ k.transpose(1, 2) / d**0.5).masked_fill(~causal, float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, h * d)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, w["model.norm.weight"]) @ head.T


@pytest.mark.parametrize("tied", [True, False])
def test_model_matches_an_independent_plain_llama(tied: bool) -> None:
    config = tiny_config(tie_word_embeddings=tied)
    weights = tiny_weights(config, seed=3)
    model = LlamaModel(config, dtype=torch.float32)
    model.load_weights(weights)
    torch.testing.assert_close(
        model.reference_logits(TOKENS), _plain_llama(weights, config, TOKENS), atol=1e-4, rtol=0
    )


def test_rms_norm_follows_reloaded_weights() -> None:
    """The norm's cached fp32 weight is refreshed when load_weights copies new weights in."""
    model = tiny_model(dtype=torch.bfloat16)
    hidden, eps = model.config.hidden_size, model.config.rms_norm_eps
    x = torch.randn(3, hidden)
    model.norm(x)  # caches the loaded weight
    model.load_weights({**tiny_weights(model.config), "model.norm.weight": torch.full((hidden,), 2.0)})
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * 2.0
    torch.testing.assert_close(model.norm(x), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_widened_rope_tables_give_the_written_out_rotation_bitwise(dtype: torch.dtype) -> None:
    # x * [cos | cos] + [x2 | x1] * [-sin | sin] must be x1 cos - x2 sin, x2 cos + x1 sin to the bit
    table = RopeTable(4096, inv_frequencies(64, 100_000.0, None))
    positions = torch.randint(0, 4096, (300,), generator=torch.Generator().manual_seed(0))
    x = torch.randn(300, 12, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    cos, sin = table.cos[positions], table.sin[positions]  # [T, 1, 32] each
    x1, x2 = x.float()[..., :32], x.float()[..., 32:]
    expected = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dtype)
    wide_cos, wide_sin = table.lookup(positions, interleaved=False)  # [T, 1, 64] each
    assert torch.equal(apply_rope(x, wide_cos, wide_sin, interleaved=False), expected)
