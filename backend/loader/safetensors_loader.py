"""Hugging Face Llama checkpoint directories: `config.json`, `*.safetensors`, and `tokenizer.json` or a
tiktoken `tokenizer.model` (Llama 3). Weights keep their HF names and are upcast to fp32."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from backend.loader.loaded_model import LoadedModel
from backend.loader.revision import model_revision
from backend.model.config import Llama3RopeScaling, LlamaConfig
from backend.tokenizer import tokenizer_from_hf_dir

_SUPPORTED_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM"})


def config_from_hf(raw: dict[str, Any]) -> LlamaConfig:
    archs = raw.get("architectures") or ["LlamaForCausalLM"]
    if not _SUPPORTED_ARCHITECTURES.intersection(archs):
        raise ValueError(f"unsupported architecture {archs}: only Llama-family checkpoints")
    heads = int(raw["num_attention_heads"])
    scaling = raw.get("rope_scaling")
    rope_scaling = None
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        rope_scaling = Llama3RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    elif scaling:
        raise ValueError(f"unsupported rope_scaling {scaling}")
    return LlamaConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_scaling=rope_scaling,
    )


def load_safetensors_dir(directory: Path, *, progress: bool = True) -> LoadedModel:
    config_path = directory / "config.json"
    raw = json.loads(config_path.read_text(encoding="utf-8"))
    config = config_from_hf(raw)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    with tqdm(desc=f"loading {directory.name}", unit="tensor", disable=not progress) as bar:
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if key.endswith("rotary_emb.inv_freq"):
                        continue
                    weights[key] = f.get_tensor(key).to(torch.float32)
                    bar.update()
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    name = directory.name
    tokenizer = tokenizer_from_hf_dir(directory, raw, name=name)
    return LoadedModel(
        name=name,
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        revision=model_revision([*files, config_path], config),
        chat_template=tokenizer.chat_template,
    )
