"""GGUF loading: the SmolLM2 file's facts (design §8), the Q/K un-permutation, and our one-pass reader
(backend/loader/gguf_file.py) against the `gguf` package's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.loader import LoadedModel, load_model
from backend.loader.gguf_loader import model_name_from_file, unpermute_qk


def hf_to_gguf_permute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's convert script `permute`, applied to HF Q/K rows."""
    return (
        weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


@pytest.mark.parametrize("n_heads", [1, 3, 9])
def test_unpermute_inverts_the_converter_permutation(n_heads: int) -> None:
    hf = torch.randn(n_heads * 64, 40)
    assert torch.equal(unpermute_qk(hf_to_gguf_permute(hf, n_heads), n_heads), hf)
    assert not torch.equal(hf_to_gguf_permute(hf, n_heads), hf)


def test_quantization_suffix_is_not_part_of_the_model_name() -> None:
    assert model_name_from_file(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct"
    assert model_name_from_file(Path("llama-3.2-1b.F16.gguf")) == "llama-3.2-1b"
    assert model_name_from_file(Path("model.gguf")) == "model"


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load_model(None, progress=False)


@pytest.mark.slow
def test_smollm2_config_matches_the_file(smollm2: LoadedModel) -> None:
    c = smollm2.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert c.rope_theta == 100000.0 and c.tie_word_embeddings and c.vocab_size == 49152
    assert not c.rope_interleaved  # Q/K were un-permuted to the HF layout
    assert "lm_head.weight" not in smollm2.weights
    assert smollm2.weights["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert all(w.dtype == torch.float32 for w in smollm2.weights.values())
    assert smollm2.tokenizer.eos_token_ids == frozenset({2})
    assert smollm2.chat_template is not None and "<|im_start|>" in smollm2.chat_template
    assert smollm2.revision.startswith("rev-")


@pytest.mark.slow
def test_smollm2_reference_forward_knows_paris(smollm2: LoadedModel) -> None:
    from backend.model.llama import LlamaModel

    model = LlamaModel(smollm2.config, dtype=torch.float32)
    model.load_weights(smollm2.weights)
    tok = smollm2.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    ids = tok.encode(prompt + "The capital of France is")
    with torch.no_grad():
        next_id = int(model.reference_logits(torch.tensor(ids))[-1].argmax())
    assert tok.decode([next_id]) == " Paris"


@pytest.mark.slow
def test_smollm2_weights_are_ggufs_own_dequantization(smollm2: LoadedModel) -> None:
    """The fp32 weights (the reference the goldens pin) are gguf's dequantization of every tensor, bit for bit,
    though the 4-bit ones are computed from their blocks in torch."""
    import gguf
    import numpy as np

    from backend.loader import default_model_path
    from backend.loader.gguf_loader import _qk_heads, hf_name

    reader = gguf.GGUFReader(default_model_path())
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        assert name is not None
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = np.ascontiguousarray(
            gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32
        )
        expected = torch.from_numpy(array.copy()).reshape(shape)
        heads = _qk_heads(name, smollm2.config)
        if heads:
            expected = unpermute_qk(expected, heads)
        assert torch.equal(smollm2.weights[name], expected), name


@pytest.mark.slow
def test_the_one_pass_reader_reads_what_ggufs_reader_reads() -> None:
    """Every metadata value (and its Python type) and every tensor's name, shape, type and data."""
    import gguf
    import numpy as np

    from backend.loader import default_model_path
    from backend.loader.gguf_file import read_gguf

    path = default_model_path()
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata.keys() == fields.keys() and len(fields) > 20
    for key, value in fields.items():
        assert ours.metadata[key] == value and type(ours.metadata[key]) is type(value), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, other in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.shape == tuple(int(d) for d in other.shape) and mine.tensor_type == other.tensor_type
        assert mine.data.dtype == other.data.dtype and mine.data.shape == other.data.shape, mine.name
        assert np.array_equal(mine.data, other.data), mine.name


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    from backend.loader.gguf_file import read_gguf

    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(path)
