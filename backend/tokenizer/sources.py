"""Build a `Tokenizer` from what a model ships: GGUF metadata, `tokenizer.json`, or a tiktoken
`tokenizer.model` (Llama 3). Each source is parsed once here; nothing else reads tokenizer files."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from backend.tokenizer.byte_level import ranks_from_byte_level_vocab
from backend.tokenizer.tokenizer import Tokenizer
from tokenedge_wire.pattern import LLAMA3, pattern_for_gguf_pre, pattern_for_hf_pre_tokenizer

# llama.cpp token types (gguf `tokenizer.ggml.token_type`).
_GGUF_CONTROL = 3
_GGUF_USER_DEFINED = 4


def tokenizer_from_gguf_metadata(meta: Mapping[str, Any], name: str) -> Tokenizer:
    """`meta` holds the `tokenizer.*` GGUF fields as Python values."""
    model = meta["tokenizer.ggml.model"]
    if model != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {model!r}: only byte-level BPE ('gpt2')")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    specials = {tokens[i]: i for i, t in enumerate(types) if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)}
    built = ranks_from_byte_level_vocab(tokens, meta["tokenizer.ggml.merges"], specials)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    return Tokenizer(
        name=name,
        pattern=pattern_for_gguf_pre(meta.get("tokenizer.ggml.pre", "default")),
        mergeable_ranks=built.mergeable_ranks,
        special_tokens=built.special_tokens,
        vocab_size=built.vocab_size,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[int(i) for i in (eos, eot) if i is not None],
        placeholder_ids=built.placeholder_ids,
        chat_template=meta.get("tokenizer.chat_template"),
    )


def tokenizer_from_hf_dir(directory: Path, model_config: Mapping[str, Any], name: str) -> Tokenizer:
    """A checkpoint directory with `tokenizer.json` (byte-level BPE) or a tiktoken `tokenizer.model`."""
    tok_config = _read_json(directory / "tokenizer_config.json") or {}
    eos_ids = _eos_ids(directory, model_config)
    bos = model_config.get("bos_token_id")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # several named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if (directory / "tokenizer.json").exists():
        spec = _read_json(directory / "tokenizer.json")
        assert spec is not None
        return _from_tokenizer_json(spec, name, bos, eos_ids, template)
    if (directory / "tokenizer.model").exists():
        return _from_tiktoken_model(directory / "tokenizer.model", tok_config, name, bos, eos_ids, template)
    raise FileNotFoundError(f"{directory}: neither tokenizer.json nor tokenizer.model")


def _from_tokenizer_json(
    spec: Mapping[str, Any], name: str, bos: int | None, eos_ids: list[int], template: str | None
) -> Tokenizer:
    model = spec["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise ValueError("unsupported tokenizer.json: only byte-level BPE (no SentencePiece byte fallback)")
    added = {t["content"]: int(t["id"]) for t in spec.get("added_tokens", [])}
    vocab: dict[str, int] = {**model["vocab"], **added}
    size = max(vocab.values()) + 1
    tokens = [""] * size
    for text, token_id in vocab.items():
        tokens[token_id] = text
    missing = [i for i, t in enumerate(tokens) if t == ""]
    if missing:
        raise ValueError(f"tokenizer.json has no token for ids {missing[:5]}")
    built = ranks_from_byte_level_vocab(tokens, model.get("merges", []), added)
    return Tokenizer(
        name=name,
        pattern=pattern_for_hf_pre_tokenizer(spec.get("pre_tokenizer")),
        mergeable_ranks=built.mergeable_ranks,
        special_tokens=built.special_tokens,
        vocab_size=built.vocab_size,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        placeholder_ids=built.placeholder_ids,
        chat_template=template,
    )


def _from_tiktoken_model(
    path: Path,
    tok_config: Mapping[str, Any],
    name: str,
    bos: int | None,
    eos_ids: list[int],
    template: str | None,
) -> Tokenizer:
    ranks: dict[bytes, int] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len({*ranks.values()}) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
        raise ValueError(f"{path}: not a complete tiktoken rank file")
    decoder = tok_config.get("added_tokens_decoder")
    specials = (
        {v["content"]: int(k) for k, v in decoder.items()} if decoder else _llama3_special_tokens(len(ranks))
    )
    return Tokenizer(
        name=name,
        pattern=LLAMA3,
        mergeable_ranks=ranks,
        special_tokens=specials,
        vocab_size=max([*ranks.values(), *specials.values()]) + 1,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        chat_template=template,
    )


def _llama3_special_tokens(base: int) -> dict[str, int]:
    """Meta's Llama 3.1 special-token layout: 256 ids after the ranks."""
    named = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(2, 256 - len(named) + 2)]
    return {text: base + i for i, text in enumerate(named + reserved)}


def _eos_ids(directory: Path, model_config: Mapping[str, Any]) -> list[int]:
    generation = _read_json(directory / "generation_config.json") or {}
    ids: list[int] = []
    for source in (model_config.get("eos_token_id"), generation.get("eos_token_id")):
        ids.extend(_as_ids(source))
    return sorted(set(ids))


def _as_ids(value: int | Iterable[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
