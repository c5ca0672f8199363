"""backend/engine/grammar.py: properties in the declared order, cache keys, the byte-bounded LRU, independent
per-sequence matchers."""

from __future__ import annotations

from typing import Any

import pytest

from backend.engine.grammar import GrammarCompiler, GrammarError, GrammarMatcher
from harness.models.tiny import byte_tokenizer

FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def compiler(max_cache_bytes: int = 1 << 20) -> GrammarCompiler:
    return GrammarCompiler(byte_tokenizer("", eos=0), 256, max_cache_bytes)


def walk(matcher: GrammarMatcher, text: bytes) -> None:
    for byte in text:
        assert matcher.allowed(256)[byte], (text, chr(byte))
        assert matcher.accept(byte)


def test_a_schema_is_compiled_once_and_a_reordered_one_apart() -> None:
    c = compiler()
    first = c.json_schema(FLAG, strict=True)
    assert c.json_schema(dict(FLAG), True) is first and c.compiled_total == 1
    reordered = {"required": ["ok"], "properties": {"ok": {"type": "boolean"}}, "type": "object"}
    assert c.json_schema(reordered, True) is not first  # member order may be the answer's order: its own key
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


def person(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": ["country", "name"],
        "additionalProperties": False,
    }


NAME_FIRST = person({"name": {"type": "string"}, "country": {"enum": ["FR", "NO"]}})


def test_properties_are_generated_in_the_declared_order() -> None:
    """OpenAI: structured outputs are produced in the order of the schema's keys (`name` before `country`)."""
    matcher = compiler().json_schema(NAME_FIRST, strict=True).new_matcher()
    walk(matcher, b'{"')
    allowed = matcher.allowed(256)
    assert allowed[ord("n")] and not allowed[ord("c")]
    walk(matcher, b'name":"Ada","country":"NO"}')
    done = matcher.allowed(256)
    assert done[0] and int(done.sum()) == 1  # complete: EOS only


def test_the_other_declared_order_is_generated_the_other_way() -> None:
    country_first = person(dict(reversed(NAME_FIRST["properties"].items())))
    c = compiler()  # one compiler: the two orders are two grammars, not one cached
    name_first, other = (
        c.json_schema(NAME_FIRST, True).new_matcher(),
        c.json_schema(country_first, True).new_matcher(),
    )
    walk(name_first, b'{"')
    walk(other, b'{"')
    assert not other.allowed(256)[ord("n")] and other.allowed(256)[ord("c")]
    walk(other, b'country":"FR","name":"Ada"}')
    assert c.compiled_total == 2


def test_model_rows_past_the_tokenizer_vocabulary_are_never_allowed() -> None:
    allowed = compiler().json_schema(FLAG, True).new_matcher().allowed(320)  # a model padded to 320 rows
    assert allowed.shape == (320,) and allowed[ord("{")] and not allowed[256:].any()
