"""Tests for gateway/keys/canonical.py, the edges of the canonical form: what cannot be canonicalized (a typed error,
never a crash), the exact JSON bytes keys are hashed from, idempotence at every level and where key order is kept
(property-based, each key-order property with a mutation check).
Which requests are equivalent at each level: test_canonical.py.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from gateway.keys import canonical
from gateway.keys.canonical import (
    CanonicalizationError,
    Level,
    aggressive_text,
    canonical_json,
    canonicalize,
    normalized_text,
)
from gateway.keys.jsonvalue import MAX_DEPTH
from tests.gateway.test_canonical import CHAT, TEXT_LEVELS, canon, chat

# --- what cannot be canonicalized ------------------------------------------------------------------------

REJECTED = [
    ("NaN", chat(temperature=float("nan"))),
    ("Infinity", chat(max_tokens=float("inf"))),
    ("non-string key", chat(logit_bias={1: 2})),
    ("not JSON", chat(extra={1, 2})),
    ("lone surrogate", chat("\ud800")),
    ("huge integer", chat(seed=2**70)),
    ("array body", [1, 2]),
]


@pytest.mark.parametrize("body", [c[1] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_uncanonicalizable_input_is_a_canonicalization_error(body: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canon(body)


def test_too_deep_nesting_is_a_canonicalization_error_not_a_crash() -> None:
    nested: Any = 0
    for _ in range(MAX_DEPTH + 5):
        nested = [nested]
    with pytest.raises(CanonicalizationError, match="nested"):
        canon(chat(extra=nested))


def test_unknown_endpoint_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        canonicalize("images/generations", {}, Level.EXACT)


# --- canonical_json --------------------------------------------------------------------------------------

JSON_CASES = [
    ("top level sorted, nested order kept", {"b": 1, "a": {"d": 2, "c": 3}}, b'{"a":{"d":2,"c":3},"b":1}'),
    ("integral floats as ints", [1.0, -0.0, 2.5, 1e15], b"[1,0,2.5,1000000000000000]"),
    ("UTF-8 not escaped", {"k": "é✓"}, '{"k":"é✓"}'.encode()),
    ("tuples as arrays", (1, None, True), b"[1,null,true]"),
    ("huge floats stay floats", [1e300], b"[1e+300]"),
]


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in JSON_CASES], ids=[c[0] for c in JSON_CASES])
def test_canonical_json_bytes(obj: Any, expected: bytes) -> None:
    assert canonical_json(obj) == expected


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), {"a": [float("nan")]}])
def test_canonical_json_rejects_nan_and_infinity(bad: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(bad)


# --- properties ------------------------------------------------------------------------------------------

_chars = st.characters(blacklist_categories=("Cs",))
_texts = st.text(_chars, max_size=12) | st.sampled_from(
    ["", " ", "\u200b", "\r\n", "e\u0301", "Ａ!", "ß", "ǅ", "\u2000"]
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
    max_leaves=8,
)
_content = _texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _texts}), max_size=2)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _content}
)
_chat_body = st.fixed_dictionaries(
    {"model": _texts, "messages": st.lists(_message, max_size=3)},
    optional={
        "temperature": st.sampled_from([0, 0.0, 1, 1.0, None, 0.7]),
        "n": st.sampled_from([1, 1.0, 2]),
        "stop": st.sampled_from([None, [], ["x"], "x", ["a", "b"]]),
        "max_tokens": st.sampled_from([None, 5, 5.0, 6]),
        "max_completion_tokens": st.sampled_from([None, 5, 7]),
        "tools": st.sampled_from([None, [], [{"type": "function"}]]),
        "tool_choice": st.sampled_from(["none", "auto", "required", None]),
        "stream": st.booleans(),
        "extra": _json,
    },
)


@settings(max_examples=150, deadline=None)
@given(body=_chat_body, level=st.sampled_from(TEXT_LEVELS))
def test_canonicalize_is_idempotent(body: dict[str, Any], level: Level) -> None:
    once = canonicalize(CHAT, body, level)
    assert canonicalize(CHAT, once, level) == once
    assert canonical_json(canonicalize(CHAT, once, level)) == canonical_json(once)  # member order included
    assert canonical_json(canonicalize(CHAT, orjson.loads(canonical_json(once)), level)) == canonical_json(
        once
    )


@settings(max_examples=100, deadline=None)
@given(
    body=st.fixed_dictionaries({"prompt": _texts | st.lists(_texts | st.integers(0, 9), max_size=3)}),
    endpoint=st.sampled_from(["completions", "embeddings"]),
    level=st.sampled_from(TEXT_LEVELS),
)
def test_prompt_and_input_canonicalization_is_idempotent(
    body: dict[str, Any], endpoint: str, level: Level
) -> None:
    if endpoint == "embeddings":
        body = {"input": body["prompt"]}
    once = canonicalize(endpoint, body, level)
    assert canonicalize(endpoint, once, level) == once


@settings(max_examples=300, deadline=None)
@given(text=st.text(_chars, max_size=20))
def test_text_normalizers_are_idempotent(text: str) -> None:
    assert normalized_text(normalized_text(text)) == normalized_text(text)
    assert aggressive_text(aggressive_text(text)) == aggressive_text(text)


# --- key order: sorted where no upstream reads it, kept everywhere else ------------------------------------

_props = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer"])}),
    min_size=2,
    max_size=5,
)
_tool = _props.map(
    lambda p: {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": p}},
    }
)
_order_body = st.fixed_dictionaries(
    {
        "model": _texts,
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": _content}, optional={"name": _texts}),
            min_size=1,
            max_size=3,
        ),
        "tools": st.lists(_tool, min_size=1, max_size=2),
    },
    optional={
        "logit_bias": st.dictionaries(st.integers(0, 999).map(str), st.integers(-100, 100), max_size=4),
        "seed": st.integers(0, 9),
        "extra": _json,
    },
)


def _bytes(body: dict[str, Any]) -> bytes:
    return canonical_json(canonicalize(CHAT, body, Level.EXACT))


def _shuffled(obj: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    items = list(obj.items())
    rng.shuffle(items)
    return dict(items)


def _message(message: Any, rng: random.Random) -> Any:
    content = message["content"]
    if isinstance(content, list):
        message = {**message, "content": [_shuffled(part, rng) for part in content]}
    return _shuffled(message, rng)


def _reordered_where_order_is_free(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    out = {**body, "messages": [_message(m, rng) for m in body["messages"]]}
    if "logit_bias" in out:
        out["logit_bias"] = _shuffled(out["logit_bias"], rng)
    return _shuffled(out, rng)


def shared_order(body: dict[str, Any], rng: random.Random) -> None:
    assert _bytes(_reordered_where_order_is_free(body, rng)) == _bytes(body)


def kept_order(body: dict[str, Any], which: int) -> None:
    tools = body["tools"]
    i = which % len(tools)
    parameters = tools[i]["function"]["parameters"]
    flipped = {**parameters, "properties": dict(reversed(parameters["properties"].items()))}
    other = [
        *tools[:i],
        {**tools[i], "function": {**tools[i]["function"], "parameters": flipped}},
        *tools[i + 1 :],
    ]
    assert orjson.dumps(tools) in _bytes(body)  # the client's bytes, in its order
    assert _bytes({**body, "tools": other}) != _bytes(body)


SHARED = {"body": _order_body, "rng": st.randoms(use_true_random=False)}
KEPT = {"body": _order_body, "which": st.integers(0, 1)}


@settings(max_examples=100, deadline=None)
@given(**SHARED)
def test_order_no_upstream_reads_never_splits_a_key(body: dict[str, Any], rng: random.Random) -> None:
    shared_order(body, rng)


@settings(max_examples=100, deadline=None)
@given(**KEPT)
def test_order_inside_tools_is_kept_and_keeps_keys_apart(body: dict[str, Any], which: int) -> None:
    kept_order(body, which)


def fails(prop: Any, strategies: dict[str, Any]) -> None:
    """The property, run under a mutation, finds a counterexample (not shrunk: any one will do)."""
    run = settings(max_examples=200, deadline=None, database=None, phases=[Phase.generate])(
        given(**strategies)(prop)
    )
    with pytest.raises(AssertionError):
        run()


def _sort_everything(obj: Any, option: int = 0) -> bytes:
    return orjson.dumps(obj, option=option | orjson.OPT_SORT_KEYS)


def test_mutation_sorting_every_depth_fails_the_kept_order_property(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        canonical, "orjson", SimpleNamespace(dumps=_sort_everything, JSONEncodeError=ValueError)
    )
    fails(kept_order, KEPT)


def test_mutation_sorting_nothing_fails_the_shared_order_property(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canonical, "_sorted", dict)  # every member kept in the client's order
    fails(shared_order, SHARED)
