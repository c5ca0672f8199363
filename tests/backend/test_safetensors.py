"""Safetensors checkpoint directories: a tiny random Llama written to disk loads back identically."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from backend.loader import load_model
from backend.tokenizer.byte_level import bytes_to_unicode
from harness.models.tiny import tiny_config, tiny_weights

HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 0,
}


def tokenizer_json() -> dict:
    """Byte-level BPE over 256 ids: 2 specials, 250 bytes (6 control bytes left out), 4 merges."""
    table = bytes_to_unicode()
    byte_tokens = [table[b] for b in range(256) if b not in (0x01, 0x02, 0x03, 0x04, 0x05, 0x06)]
    merged = ["Ġt", "he", "Ġthe", "ĠĠ"]
    vocab = {tok: 2 + i for i, tok in enumerate(byte_tokens + merged)}
    return {
        "added_tokens": [
            {"id": 0, "content": "<|end|>", "special": True},
            {"id": 1, "content": "<|start|>", "special": True},
        ],
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            ],
        },
        "model": {
            "type": "BPE",
            "vocab": vocab,
            "merges": [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["Ġ", "Ġ"]],
        },
    }


def write_checkpoint(directory: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    directory.mkdir(parents=True, exist_ok=True)
    weights = tiny_weights(tiny_config(), seed=seed)
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(HF_CONFIG))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|end|>{% endfor %}"
            }
        )
    )
    return weights


def test_checkpoint_dir_round_trips(tmp_path: Path) -> None:
    written = write_checkpoint(tmp_path / "tiny-llama")
    loaded = load_model(tmp_path / "tiny-llama", progress=False)
    assert loaded.name == "tiny-llama"
    assert loaded.config == tiny_config()
    assert loaded.weights.keys() == written.keys()
    for name, tensor in written.items():
        assert loaded.weights[name].dtype == torch.float32
        torch.testing.assert_close(loaded.weights[name], tensor.to(torch.bfloat16).float())
    tok = loaded.tokenizer
    assert tok.vocab_size == 256 and tok.eos_token_ids == frozenset({0}) and tok.bos_token_id == 1
    assert tok.decode(tok.encode("the 12  x<|end|>")) == "the 12  x<|end|>"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|start|>user\nhi<|end|>"


def test_revision_changes_when_weights_change(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "a", seed=0)
    write_checkpoint(tmp_path / "b", seed=0)
    write_checkpoint(tmp_path / "c", seed=1)
    a, b, c = (load_model(tmp_path / n, progress=False).revision for n in "abc")
    assert a == b
    assert a != c
