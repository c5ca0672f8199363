"""GGUF (llama.cpp) Llama checkpoints, dequantized to fp32 torch tensors under Hugging Face names; the
4-bit blocks (Q4_0, Q4_1) are also kept as they are (`LoadedModel.quantized`) for the int4 kernels.

llama.cpp's converter permutes the rows of Q and K so RoPE pairs are adjacent (GPT-J style). We undo
that permutation here, so the weights are in the Hugging Face `rotate_half` layout, exactly what
`transformers` produces when it reads the same file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from tqdm import tqdm

from backend.loader.gguf_file import read_gguf
from backend.loader.loaded_model import LoadedModel
from backend.loader.quantized import Int4Blocks, int4_blocks
from backend.loader.revision import model_revision
from backend.model.config import LlamaConfig
from backend.tokenizer import Tokenizer, tokenizer_from_gguf_metadata

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors llama.cpp stores that the HF layout derives instead (RoPE frequency tables).
_SKIPPED = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})


def unpermute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of the HF->GGUF `permute`: per head, rows (d0, d_half, d1, d_half+1, ...) -> (halves)."""
    # weight: [n_heads * head_dim, in] with each head's rows interleaved in pairs
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, half, 2, cols).transpose(1, 2).reshape(rows, cols)


def _qk_heads(name: str, config: LlamaConfig) -> int:
    """The head count to un-permute a Q or K weight by; 0 for any other tensor."""
    if name.endswith("q_proj.weight"):
        return config.num_heads
    if name.endswith("k_proj.weight"):
        return config.num_kv_heads
    return 0


def config_from_gguf(meta: dict[str, Any], has_output: bool) -> LlamaConfig:
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r}: only 'llama'")
    hidden = int(meta["llama.embedding_length"])
    heads = int(meta["llama.attention.head_count"])
    vocab = meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_layers=int(meta["llama.block_count"]),
        num_heads=heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=int(
            meta.get("llama.attention.key_length", meta.get("llama.rope.dimension_count", hidden // heads))
        ),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        max_position_embeddings=int(meta["llama.context_length"]),
        tie_word_embeddings=not has_output,
    )


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _SKIPPED:
        return None
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def model_name_from_file(path: Path) -> str:
    """`SmolLM2-135M-Instruct.Q4_1.gguf` -> `SmolLM2-135M-Instruct` (the quantization is not the model)."""
    stem, _, suffix = path.stem.rpartition(".")
    return stem if stem and re.fullmatch(r"(I?Q\d\w*|[BF]\d+\w*)", suffix, flags=re.IGNORECASE) else path.stem


def gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer alone, from the metadata (no tensor is read)."""
    return tokenizer_from_gguf_metadata(read_gguf(path).metadata, name=model_name_from_file(path))


def load_gguf(path: Path, *, progress: bool = True) -> LoadedModel:
    file = read_gguf(path)
    meta = file.metadata
    config = config_from_gguf(meta, has_output=any(t.name == "output.weight" for t in file.tensors))
    weights: dict[str, torch.Tensor] = {}
    quantized: dict[str, Int4Blocks] = {}
    for tensor in tqdm(file.tensors, desc=f"loading {path.name}", unit="tensor", disable=not progress):
        name = hf_name(tensor.name)
        if name is None:
            continue
        # GGUF lists dims innermost first; numpy rows are already [out, in] for matrices.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        blocks = int4_blocks(tensor.data, tensor.tensor_type, shape) if len(shape) == 2 else None
        if blocks is not None:  # gguf's numbers, from the blocks in torch (1.7 s of numpy for SmolLM2: 0.1)
            weight = blocks.dequantize()
        else:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            array = np.ascontiguousarray(array, dtype=np.float32)
            if not array.flags.writeable:  # F32 tensors come back as views of the read-only mmap
                array = array.copy()
            weight = torch.from_numpy(array).reshape(shape)
        heads = _qk_heads(name, config)
        if heads:
            weight = unpermute_qk(weight, heads)
            order = unpermute_qk(torch.arange(shape[0])[:, None], heads)[:, 0]
            blocks = blocks.rows(order) if blocks is not None else None
        weights[name] = weight
        if blocks is not None:
            quantized[name] = blocks
    name = model_name_from_file(path)
    tokenizer = tokenizer_from_gguf_metadata(meta, name=name)
    return LoadedModel(
        name=name,
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        revision=model_revision([path], config),
        quantized=quantized,
        chat_template=tokenizer.chat_template,
    )
