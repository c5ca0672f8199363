"""backend/engine/grammar.py: canonical cache keys, the byte-bounded LRU, independent per-sequence matchers."""

from __future__ import annotations

import pytest

from backend.engine.grammar import GrammarCompiler, GrammarError, GrammarMatcher
from tests.backend.tiny import byte_tokenizer

FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def compiler(max_cache_bytes: int = 1 << 20) -> GrammarCompiler:
    return GrammarCompiler(byte_tokenizer("", eos=0), 256, max_cache_bytes)


def walk(matcher: GrammarMatcher, text: bytes) -> None:
    for byte in text:
        assert matcher.allowed(256)[byte], (text, chr(byte))
        assert matcher.accept(byte)


def test_reordered_schema_keys_share_one_compiled_grammar() -> None:
    c = compiler()
    first = c.json_schema(FLAG, strict=True)
    again = c.json_schema(
        {"required": ["ok"], "properties": {"ok": {"type": "boolean"}}, "type": "object"}, True
    )
    assert again is first and c.compiled_total == 1
    assert c.json_schema(FLAG, strict=False) is not first  # strictness is part of the key


def test_the_cache_evicts_least_recently_used_past_its_byte_budget() -> None:
    one = compiler().json_schema(FLAG, True).size_bytes
    c = compiler(max_cache_bytes=2 * one + one // 2)
    schemas = [{**FLAG, "title": t} for t in ("a", "b", "c")]
    c.json_schema(schemas[0], True)
    c.json_schema(schemas[1], True)
    c.json_schema(schemas[0], True)  # a is now the most recent
    c.json_schema(schemas[2], True)  # evicts b
    assert len(c) == 2 and c.cache_bytes <= c.max_cache_bytes
    total = c.compiled_total
    c.json_schema(schemas[0], True)
    assert c.compiled_total == total
    c.json_schema(schemas[1], True)
    assert c.compiled_total == total + 1


def test_matchers_of_one_grammar_advance_independently() -> None:
    grammar = compiler().json_schema(FLAG, True)
    a, b = grammar.new_matcher(), grammar.new_matcher()
    walk(a, b'{"ok":tr')
    assert b.allowed(256)[ord("{")] and not b.allowed(256)[ord("t")]
    walk(a, b"ue}")
    allowed = a.allowed(256)
    assert allowed[0] and int(allowed.sum()) == 1  # complete: EOS only


def test_a_bad_schema_is_a_grammar_error() -> None:
    with pytest.raises(GrammarError):
        compiler().json_schema({"type": "object", "properties": {"x": {"type": "nonsense"}}}, True)


def test_properties_are_generated_in_sorted_order_whatever_the_spelling() -> None:
    both = {"b": {"type": "boolean"}, "a": {"type": "boolean"}}
    for properties in (both, dict(reversed(both.items()))):
        schema = {
            "type": "object",
            "properties": properties,
            "required": ["a", "b"],
            "additionalProperties": False,
        }
        matcher = compiler().json_schema(schema, strict=True).new_matcher()  # a fresh compiler: no cache hit
        walk(matcher, b'{"')
        allowed = matcher.allowed(256)
        assert allowed[ord("a")] and not allowed[ord("b")]


def test_model_rows_past_the_tokenizer_vocabulary_are_never_allowed() -> None:
    allowed = compiler().json_schema(FLAG, True).new_matcher().allowed(320)  # a model padded to 320 rows
    assert allowed.shape == (320,) and allowed[ord("{")] and not allowed[256:].any()
