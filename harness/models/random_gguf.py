"""Random-weight GGUFs of real model shapes (SmolLM2-360M and -1.7B, Llama-3.2-1B), for speed only: how both
engines scale with model size where only the 135M model ships. Nothing is downloaded: the shapes are the published
configurations, written here, and the tokenizer is the shipped SmolLM2 file's (Llama-3.2-1B's 128256-row vocabulary
pads it with unused tokens). The weights are random 4-bit blocks written straight as GGUF bytes with the `gguf`
package (a Q4_0 or Q4_1 block is a scale, for Q4_1 a minimum, and 32 random nibbles), scaled so activations keep
their size through the layers. Such a model says nothing true, so every file is marked: `general.name` says
"random weights, speed only", `tokenedge.random_weights` is true, and the file name starts with `random-`. Llama
3.2's RoPE scaling (`rope_freqs`) is left out: it costs nothing per token. Files are cached and made once
(`<cache>/random-models/`, $TOKENEDGE_RANDOM_MODELS).

    python -m harness.models.random_gguf [--format Q4_0] [SHAPE ...]     # prints each file's path
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from backend.loader import default_model_path

CACHE_ENV = "TOKENEDGE_RANDOM_MODELS"
_TOKENIZER_KEYS = (
    "tokenizer.ggml.pre",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.chat_template",
)
_UNUSED = 5  # llama.cpp's token type for a vocabulary row no text encodes to


@dataclass(frozen=True, slots=True)
class Shape:
    """A published Llama-family configuration (the numbers its config.json states)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    s.name: s
    for s in (
        Shape("smollm2-360m", 960, 32, 15, 5, 2560, 49152, 100000.0),
        Shape("smollm2-1.7b", 2048, 24, 32, 32, 8192, 49152, 130000.0),
        Shape("llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, 500000.0),
    )
}
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "tokenedge" / "random-models"


def random_blocks(rows: int, cols: int, fmt: str, rng: np.random.Generator) -> np.ndarray:
    """[rows, cols] weights as 4-bit blocks of random nibbles, std about 1/sqrt(cols) (uint8 [rows, bytes])."""
    # blocks: [rows, cols // 32, block bytes]; fp16 scale first, then (Q4_1) the fp16 minimum, then 16 nibble bytes
    assert cols % 32 == 0, cols
    blocks = rng.integers(0, 256, size=(rows, cols // 32, _BLOCK_BYTES[fmt]), dtype=np.uint8)
    scale = np.float16(1.0 / (4.6 * np.sqrt(cols)))  # a uniform nibble's std is 4.6: w = d * (q - 8)
    blocks[:, :, 0:2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    if fmt == "Q4_1":  # w = d * q + m with m = -8 d: the same centred weights
        blocks[:, :, 2:4] = np.frombuffer(np.float16(-8 * scale).tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, -1)


def _tokenizer(writer: gguf.GGUFWriter, vocab: int) -> None:
    """The shipped SmolLM2 vocabulary, padded with unused rows up to `vocab`."""
    reader = gguf.GGUFReader(default_model_path())
    fields = reader.fields
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    types = list(fields["tokenizer.ggml.token_type"].contents())
    assert vocab >= len(tokens), (vocab, len(tokens))
    pad = vocab - len(tokens)
    writer.add_tokenizer_model(str(fields["tokenizer.ggml.model"].contents()))
    writer.add_token_list([*tokens, *(f"<|random_pad_{i}|>" for i in range(pad))])
    writer.add_token_types([*types, *([_UNUSED] * pad)])
    writer.add_add_bos_token(False)
    for key in _TOKENIZER_KEYS:
        field = fields[key]
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, int(value))


def _metadata(writer: gguf.GGUFWriter, shape: Shape, fmt: str) -> None:
    writer.add_name(f"{shape.name} shape, random weights, speed only")
    writer.add_bool("tokenedge.random_weights", True)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{fmt}"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_random_gguf(shape: Shape, path: Path, fmt: str = "Q4_0", seed: int = 0) -> Path:
    """`shape` as a random-weight GGUF at `path` (tied embeddings, as all three models have)."""
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[fmt]
    writer = gguf.GGUFWriter(path, "llama")
    _metadata(writer, shape, fmt)
    _tokenizer(writer, shape.vocab)
    ones = np.ones(shape.hidden, dtype=np.float32)
    kv = shape.kv_heads * shape.head_dim
    writer.add_tensor(
        "token_embd.weight", random_blocks(shape.vocab, shape.hidden, fmt, rng), raw_dtype=qtype
    )
    for i in range(shape.layers):
        projections = {  # name: [out, in]
            "attn_q": (shape.hidden, shape.hidden),
            "attn_k": (kv, shape.hidden),
            "attn_v": (kv, shape.hidden),
            "attn_output": (shape.hidden, shape.hidden),
            "ffn_gate": (shape.ffn, shape.hidden),
            "ffn_up": (shape.ffn, shape.hidden),
            "ffn_down": (shape.hidden, shape.ffn),
        }
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        for name, (rows, cols) in projections.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", random_blocks(rows, cols, fmt, rng), raw_dtype=qtype)
    writer.add_tensor("output_norm.weight", ones)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_model(name: str, fmt: str = "Q4_0") -> Path:
    """The cached random-weight file of shape `name`, written on first use (seconds; ~1 GB for the 1.7B)."""
    target = cache_dir() / f"random-{name}.{fmt}.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        write_random_gguf(SHAPES[name], partial, fmt)
        partial.replace(target)
    return target


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="harness.models.random_gguf", description=__doc__)
    parser.add_argument("--format", default="Q4_0", choices=sorted(_BLOCK_BYTES))
    parser.add_argument("shapes", nargs="*", help=f"any of {', '.join(SHAPES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.shapes) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shape(s) {sorted(unknown)}: choose from {', '.join(SHAPES)}")
    for name in args.shapes or SHAPES:
        print(random_model(name, args.format))


if __name__ == "__main__":
    main()
