"""harness/models/random_gguf.py: a random-weight GGUF of a given shape loads as that shape in our loader, with every
projection kept as 4-bit blocks, and says it is random (speed only) in its name, its metadata and its file name."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from backend.loader import load_model
from harness.models import random_gguf as random_models
from harness.models.random_gguf import SHAPES, Shape, random_model, write_random_gguf

TOY = Shape("toy", 128, 2, 4, 2, 256, 49152 + 64, 10000.0)  # a padded vocabulary, as Llama-3.2-1B's


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1"])
def test_a_random_model_loads_as_its_shape_with_4bit_blocks(tmp_path: Path, fmt: str) -> None:
    path = write_random_gguf(TOY, tmp_path / "toy.gguf", fmt)
    loaded = load_model(path, progress=False)
    config = loaded.config
    assert (config.hidden_size, config.num_layers, config.intermediate_size) == (128, 2, 256)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (4, 2, 32, 49216)
    assert config.tie_word_embeddings and loaded.quantized is not None
    assert len(loaded.quantized) == 2 * 7 + 1  # every projection of every layer and the embedding, as blocks
    assert loaded.tokenizer.encode("hello world") == [28120, 905]  # the shipped SmolLM2 vocabulary
    reader = gguf.GGUFReader(path)
    assert reader.fields["tokenedge.random_weights"].contents() is True
    assert "random weights, speed only" in reader.fields["general.name"].contents()
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2} == {fmt}


def test_cached_files_are_named_random_and_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(random_models.CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(SHAPES, "toy", TOY)
    first = random_model("toy")
    stamp = first.stat().st_mtime_ns
    assert first.name == "random-toy.Q4_0.gguf" and random_model("toy").stat().st_mtime_ns == stamp


def test_the_shapes_are_the_published_configurations() -> None:
    """config.json of SmolLM2-360M, SmolLM2-1.7B and Llama-3.2-1B: hidden, layers, heads, KV heads, FFN, vocab."""
    table = {n: (s.hidden, s.layers, s.heads, s.kv_heads, s.ffn, s.vocab) for n, s in SHAPES.items()}
    assert table == {
        "smollm2-360m": (960, 32, 15, 5, 2560, 49152),
        "smollm2-1.7b": (2048, 24, 32, 32, 8192, 49152),
        "llama-3.2-1b": (2048, 16, 32, 8, 8192, 128256),
    }
