"""Llama-family hyperparameters: the one seam between the loaders and the forward pass.

A loader (GGUF or safetensors) produces a `LlamaConfig` plus a flat weight mapping named as in
`backend.model.llama.WEIGHT_NAMES`; nothing else about the checkpoint reaches the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Llama3RopeScaling:
    """Llama 3.1-style frequency-dependent RoPE scaling (HF `rope_scaling: {rope_type: llama3}`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor < 1.0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"invalid llama3 rope scaling: {self}")
        if self.original_max_position_embeddings < 1:
            raise ValueError("original_max_position_embeddings must be >= 1")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """Shape and numerics of a Llama-family decoder.

    `rope_interleaved` says how Q/K rows are laid out: True for GGUF files as stored (llama.cpp permutes the
    rows, so rotation pairs are adjacent, GPT-J style), False for Hugging Face checkpoints (`rotate_half`,
    pairs `d` and `d + head_dim/2`). The model applies the matching rotation; no weight is un-permuted.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0: hidden_size // num_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    rope_interleaved: bool = False
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"head_dim must be even and >= 2, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be positive")
        if self.max_position_embeddings < 1:
            raise ValueError("max_position_embeddings must be >= 1")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim
