"""The tiktoken tokenizer: construction from byte-level vocabularies, and the SmolLM2 goldens from llama.cpp."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import tiktoken

from backend.tokenizer import Tokenizer
from backend.tokenizer.byte_level import bytes_to_unicode, ranks_from_byte_level_vocab
from tokenedge_wire.pattern import GPT2, GPT2_SINGLE_DIGITS

DATA = Path(__file__).parent / "data"
SPECIALS = ["<|end|>", "<|start|>"]


def tiny_vocab(drop_bytes: tuple[int, ...] = ()) -> tuple[list[str], list[str]]:
    """Specials, the byte alphabet (minus `drop_bytes`), then merges for ' t', 'he', ' the', '  '."""
    table = bytes_to_unicode()
    tokens = [*SPECIALS, *(table[b] for b in range(256) if b not in drop_bytes)]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ Ġ"]
    tokens += ["Ġt", "he", "Ġthe", "ĠĠ"]
    return tokens, merges


def tiny_tokenizer(pattern: str = GPT2, drop_bytes: tuple[int, ...] = ()) -> Tokenizer:
    tokens, merges = tiny_vocab(drop_bytes)
    built = ranks_from_byte_level_vocab(tokens, merges, {s: i for i, s in enumerate(SPECIALS)})
    return Tokenizer(
        name="tiny",
        pattern=pattern,
        mergeable_ranks=built.mergeable_ranks,
        special_tokens=built.special_tokens,
        vocab_size=built.vocab_size,
        bos_token_id=1,
        eos_token_ids=[0],
        placeholder_ids=built.placeholder_ids,
    )


def test_merges_follow_ranks_and_round_trip() -> None:
    tok = tiny_tokenizer()
    the = tok.vocab_size - 2
    ids = tok.encode("in the hat")
    assert the in ids
    assert tok.decode(ids) == "in the hat"


def test_special_tokens_only_when_allowed() -> None:
    tok = tiny_tokenizer()
    assert tok.encode("x<|end|>") == [tok.encode("x")[0], 0]
    assert 0 not in tok.encode("x<|end|>", allow_special=False)
    assert tok.decode(tok.encode("x<|end|>", allow_special=False)) == "x<|end|>"


def test_bytes_without_a_token_are_dropped() -> None:
    tok = tiny_tokenizer(drop_bytes=(0x04,))
    assert tok.decode(tok.encode("a\x04b")) == "ab"
    with pytest.raises(ValueError):
        tok.decode([tok.vocab_size])


def test_merge_order_that_disagrees_with_ids_is_refused() -> None:
    tokens, merges = tiny_vocab()
    with pytest.raises(ValueError, match="merge order"):
        ranks_from_byte_level_vocab(
            tokens, [merges[1], merges[0], merges[2]], {s: i for i, s in enumerate(SPECIALS)}
        )


def test_version_changes_with_pattern_and_ranks() -> None:
    base = tiny_tokenizer()
    assert base.version == tiny_tokenizer().version
    assert base.version != tiny_tokenizer(pattern=GPT2_SINGLE_DIGITS).version
    assert base.version != tiny_tokenizer(drop_bytes=(0x04,)).version


def test_single_digit_pattern_splits_digits_and_keeps_whitespace_runs() -> None:
    tok = tiny_tokenizer(pattern=GPT2_SINGLE_DIGITS)
    pieces = [tok.decode([i]) for i in tok.encode("ab 123  4")]
    assert pieces[-6:] == [" ", "1", "2", "3", "  ", "4"]
    gpt2 = [tiny_tokenizer().decode([i]) for i in tiny_tokenizer().encode("ab 123  4")]
    assert gpt2[-3:] == [" ", " ", "4"]  # GPT-2 alone glues the space to the number


def test_export_rebuilds_the_same_encoder() -> None:
    tok = tiny_tokenizer(drop_bytes=(0x06,))
    export = json.loads(json.dumps(tok.export()))
    rebuilt = tiktoken.Encoding(
        "rebuilt",
        pat_str=export["pattern"],
        mergeable_ranks={base64.b64decode(k): v for k, v in export["mergeable_ranks"].items()},
        special_tokens=export["special_tokens"],
    )
    text = "the <|start|>hat\x06 99"
    ids = [i for i in rebuilt.encode(text, allowed_special="all") if i not in set(export["dropped_ids"])]
    assert ids == tok.encode(text)
    assert export["version"] == tok.version


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Tokenizer:
    from backend.loader import default_model_path, gguf_tokenizer

    return gguf_tokenizer(default_model_path())


@pytest.mark.slow
def test_smollm2_matches_llamacpp_on_the_whole_corpus(smollm2_tokenizer: Tokenizer) -> None:
    strings = json.loads((DATA / "tokenizer_corpus.json").read_text())["strings"]
    goldens = json.loads((DATA / "tokenizer_goldens.json").read_text())
    assert len(strings) >= 300 and goldens["corpus_size"] == len(strings)
    special = [
        i
        for i, (s, g) in enumerate(zip(strings, goldens["ids_special"], strict=True))
        if smollm2_tokenizer.encode(s) != g
    ]
    ordinary = [
        i
        for i, (s, g) in enumerate(zip(strings, goldens["ids_ordinary"], strict=True))
        if smollm2_tokenizer.encode(s, allow_special=False) != g
    ]
    assert special == [] and ordinary == [], [strings[i] for i in (special + ordinary)[:5]]


@pytest.mark.slow
def test_smollm2_decodes_what_it_encodes(smollm2_tokenizer: Tokenizer) -> None:
    strings = json.loads((DATA / "tokenizer_corpus.json").read_text())["strings"]
    ranks = smollm2_tokenizer.encoding._mergeable_ranks
    missing = {b for b in range(256) if ranks[bytes([b])] >= smollm2_tokenizer.vocab_size}
    assert len(missing) == 21  # design §8: these bytes have no token, llama.cpp drops them
    lossless = [s for s in strings if not missing.intersection(s.encode())]
    assert len(lossless) >= 300
    assert [s for s in lossless if smollm2_tokenizer.decode(smollm2_tokenizer.encode(s)) != s] == []
    assert smollm2_tokenizer.eos_token_ids == frozenset({2})
    assert smollm2_tokenizer.encode("<|im_end|>") == [2]
