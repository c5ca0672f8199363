"""Tests for gateway/keys/canonical.py: which requests are equivalent at each level, and the JSON bytes.

`exact` (the default where the model's tokenizer is unknown) merges JSON-level differences only; every text
rewrite is `normalized` / `aggressive` (opt-in). The `tokens` level's form is tested here as a pure function;
its ids come from the token path (tests/gateway/test_keys_tokens.py). What cannot be canonicalized, the JSON
bytes and idempotence: test_canonical_json.py; where key order is kept: test_canonical_order.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.keys.canonical import Level, canonical_json, canonicalize, tokens_form

CHAT = "chat/completions"
TEXT_LEVELS = [Level.EXACT, Level.NORMALIZED, Level.AGGRESSIVE]  # TOKENS is built by tokens_form


def chat(content: Any = "Hello", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


def canon(body: Any, level: Level = Level.EXACT, endpoint: str = CHAT) -> dict[str, Any]:
    return canonicalize(endpoint, body, level)


# --- equivalent requests: one canonical form ------------------------------------------------------------

# JSON-level differences only: one form at every level, `exact` included.
SAME = [
    (
        "reordered keys",
        chat(),
        {"temperature": 0, "messages": [{"content": "Hello", "role": "user"}], "model": "m"},
    ),
    ("1.0 vs 1", chat(max_tokens=16), chat(max_tokens=16.0)),
    ("-0.0 vs 0", chat(), chat() | {"temperature": -0.0}),
    (
        "temperature 1 vs absent",
        {"model": "m", "messages": []},
        {"model": "m", "messages": [], "temperature": 1},
    ),
    (
        "temperature 1.0 vs absent",
        {"model": "m", "messages": []},
        {"model": "m", "messages": [], "temperature": 1.0},
    ),
    (
        "temperature null vs absent",
        {"model": "m", "messages": []},
        {"model": "m", "messages": [], "temperature": None},
    ),
    ("top_p 1", chat(), chat(top_p=1)),
    ("n 1", chat(), chat(n=1.0)),
    ("presence_penalty 0", chat(), chat(presence_penalty=0.0)),
    ("frequency_penalty 0", chat(), chat(frequency_penalty=0)),
    ("logprobs false", chat(), chat(logprobs=False)),
    ("stop null", chat(), chat(stop=None)),
    ("stop []", chat(), chat(stop=[])),
    ("stop one-element list", chat(stop="END"), chat(stop=["END"])),
    ("logit_bias {}", chat(), chat(logit_bias={})),
    ("response_format text", chat(), chat(response_format={"type": "text"})),
    ("parallel_tool_calls true", chat(), chat(parallel_tool_calls=True)),
    ("tool_choice none without tools", chat(), chat(tool_choice="none")),
    (
        "tool_choice auto with tools",
        chat(tools=[{"type": "function"}]),
        chat(tools=[{"type": "function"}], tool_choice="auto"),
    ),
    ("function_call none without functions", chat(), chat(function_call="none")),
    ("max_completion_tokens vs max_tokens", chat(max_tokens=5), chat(max_completion_tokens=5)),
    ("both max token fields equal", chat(max_tokens=5), chat(max_tokens=5, max_completion_tokens=5.0)),
    ("max_tokens null", chat(), chat(max_tokens=None)),
    ("seed null", chat(), chat(seed=None)),
    ("stream dropped", chat(), chat(stream=True, stream_options={"include_usage": True})),
    (
        "bookkeeping dropped",
        chat(),
        chat(user="u1", metadata={"a": "b"}, store=True, request_id="r"),
    ),
    (
        "content parts reordered keys",
        chat([{"type": "text", "text": "a"}]),
        chat([{"text": "a", "type": "text"}]),
    ),
]


@pytest.mark.parametrize(("a", "b"), [case[1:] for case in SAME], ids=[case[0] for case in SAME])
@pytest.mark.parametrize("level", TEXT_LEVELS)
def test_equivalent_requests_share_a_canonical_form(
    a: dict[str, Any], b: dict[str, Any], level: Level
) -> None:
    assert canon(a, level) == canon(b, level)
    assert canonical_json(canon(a, level)) == canonical_json(canon(b, level))


# Text rewrites: they change the bytes the tokenizer sees, so only the opt-in levels merge them.
NORMALIZED_SAME = [
    ("trailing space", chat("Hello"), chat("Hello ")),
    ("leading newline and tab", chat("Hello"), chat("\n\tHello")),
    ("zero-width space", chat("Hello"), chat("Hel\u200blo")),
    ("other zero-width chars", chat("Hello"), chat("\ufeffHe\u200cl\u200dl\u2060o")),
    ("CRLF vs LF", chat("a\nb"), chat("a\r\nb")),
    ("CR vs LF", chat("a\nb"), chat("a\rb")),
    ("NFC vs NFD", chat("caf\u00e9"), chat("cafe\u0301")),
    ("one text part vs string", chat("Hello"), chat([{"type": "text", "text": "Hello"}])),
    ("one text part with a trailing space", chat("Hello"), chat([{"type": "text", "text": "Hello "}])),
    (
        "system and assistant text normalized",
        chat(),
        chat() | {"messages": [{"role": "user", "content": " Hello\u200b "}]},
    ),
]


@pytest.mark.parametrize(
    ("a", "b"), [case[1:] for case in NORMALIZED_SAME], ids=[case[0] for case in NORMALIZED_SAME]
)
def test_text_rewrites_merge_only_at_the_opt_in_levels(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert canonical_json(canon(a, Level.EXACT)) != canonical_json(canon(b, Level.EXACT))
    for level in (Level.NORMALIZED, Level.AGGRESSIVE):
        assert canonical_json(canon(a, level)) == canonical_json(canon(b, level))


DIFFERENT = [
    ("different content", chat("Hello"), chat("Goodbye")),
    ("different model", chat(), chat() | {"model": "other"}),
    ("tools", chat(), chat(tools=[{"type": "function", "function": {"name": "f"}}])),
    ("max_tokens", chat(), chat(max_tokens=5)),
    ("different max_tokens", chat(max_tokens=5), chat(max_tokens=6)),
    ("conflicting max token fields", chat(max_tokens=5), chat(max_tokens=5, max_completion_tokens=6)),
    ("temperature 0 vs absent", chat(), {"model": "m", "messages": [{"role": "user", "content": "Hello"}]}),
    ("true is not 1", chat(n=1), chat(n=True)),
    ("inner whitespace kept", chat("a b"), chat("a  b")),
    ("indentation kept", chat("def f():\n    return 1"), chat("def f():\n  return 1")),
    ("blank line kept", chat("a\nb"), chat("a\n\nb")),
    ("case kept at normalized", chat("Hello"), chat("hello")),
    ("punctuation kept at normalized", chat("Hello"), chat("Hello!")),
    ("full-width kept at normalized", chat("Hello"), chat("Ｈｅｌｌｏ")),
    (
        "two text parts are not a string",
        chat("ab"),
        chat([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
    ),
    ("text part with extra keys kept", chat("a"), chat([{"type": "text", "text": "a", "cache_control": {}}])),
    ("stop order matters", chat(stop=["a", "b"]), chat(stop=["b", "a"])),
    ("stop strings are not normalized", chat(stop="END "), chat(stop="END")),
    ("tool_choice auto without tools kept", chat(), chat(tool_choice="auto")),
    (
        "tool_choice required",
        chat(tools=[{"type": "function"}]),
        chat(tools=[{"type": "function"}], tool_choice="required"),
    ),
    ("unknown field kept", chat(), chat(top_k=1)),
    ("unknown null field kept", chat(), chat(guided_json=None)),
    ("role", chat(), chat() | {"messages": [{"role": "system", "content": "Hello"}]}),
    ("seed", chat(), chat(seed=1)),
    ("logprobs true", chat(), chat(logprobs=True)),
]


@pytest.mark.parametrize(("a", "b"), [case[1:] for case in DIFFERENT], ids=[case[0] for case in DIFFERENT])
@pytest.mark.parametrize("level", [Level.EXACT, Level.NORMALIZED])
def test_different_requests_keep_different_canonical_forms(
    a: dict[str, Any], b: dict[str, Any], level: Level
) -> None:
    assert canonical_json(canon(a, level)) != canonical_json(canon(b, level))


def test_tool_call_arguments_and_names_are_never_normalized() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": " F\u200b ", "arguments": '{"a": 1.0 }\r\n'}}
    body = chat() | {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}
    for level in TEXT_LEVELS:
        assert canon(body, level)["messages"][0]["tool_calls"] == [call]


def test_tool_message_content_is_text() -> None:
    body = chat() | {"messages": [{"role": "tool", "tool_call_id": "c1", "content": " 42\r\n"}]}
    assert canon(body, Level.NORMALIZED)["messages"][0] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "42",
    }
    assert canon(body, Level.EXACT)["messages"][0]["content"] == " 42\r\n"


def test_exact_does_not_touch_text_or_content_parts() -> None:
    text = " Hel\u200blo\r\n"
    assert canon(chat(text), Level.EXACT)["messages"][0]["content"] == text
    one = [{"type": "text", "text": text}]
    assert canon(chat(one), Level.EXACT)["messages"][0]["content"] == one
    two = [{"type": "text", "text": "Name a "}, {"type": "text", "text": "color."}]
    assert canon(chat(two), Level.EXACT)["messages"][0]["content"] == two
    for endpoint, field in (("completions", "prompt"), ("embeddings", "input")):
        assert canon({field: text}, Level.EXACT, endpoint)[field] == text
        assert canon({field: [text, "b "]}, Level.EXACT, endpoint)[field] == [text, "b "]


def test_the_tokens_level_is_not_a_text_level() -> None:
    with pytest.raises(ValueError, match="tokens_form"):
        canonicalize(CHAT, chat(), Level.TOKENS)


def test_tokens_form_keeps_every_other_field_in_its_exact_form_apart_from_the_ids() -> None:
    body = chat(" Hi ", temperature=0.0, top_p=1, tools=[{"b": 1, "a": 2.0}], ids=[9], tokenizer="client")
    form = tokens_form(CHAT, canon(body, Level.EXACT), [5, 6], "tok-1")
    assert form == {
        "input": {"ids": [5, 6], "tokenizer": "tok-1"},
        "params": {
            "model": "m",
            "temperature": 0,
            "tools": [{"b": 1, "a": 2}],
            "ids": [9],
            "tokenizer": "client",
        },
    }
    assert b'"tools":[{"b":1,"a":2}]' in canonical_json(form)  # order inside params kept, as in `exact`
    assert tokens_form("completions", {"prompt": "x", "echo": True}, [1], "t")["params"] == {"echo": True}
    assert tokens_form("embeddings", {"input": ["x"], "model": "e"}, [[1]], "t")["params"] == {"model": "e"}


def test_exact_still_normalizes_json() -> None:
    assert canon(chat(temperature=0.0, top_p=1.0, stream=True), Level.EXACT) == canon(chat(), Level.EXACT)


AGGRESSIVE_SAME = [
    ("case", "Hello World", "hello world"),
    ("punctuation", "Hello, world!", "hello world"),
    ("full-width", "Ｈｅｌｌｏ　ｗｏｒｌｄ", "hello world"),
    ("whitespace runs", "hello \n\t world", "hello world"),
    ("casefold sharp s", "STRASSE", "straße"),
    ("unicode punctuation", "«hello» — world…", "hello world"),
]


@pytest.mark.parametrize(("a", "b"), [c[1:] for c in AGGRESSIVE_SAME], ids=[c[0] for c in AGGRESSIVE_SAME])
def test_aggressive_folds_case_punctuation_and_width(a: str, b: str) -> None:
    assert canon(chat(a), Level.AGGRESSIVE) == canon(chat(b), Level.AGGRESSIVE)
    assert canon(chat(a)) != canon(chat(b))


def test_aggressive_keeps_words_apart() -> None:
    assert canon(chat("hello world"), Level.AGGRESSIVE) != canon(chat("helloworld"), Level.AGGRESSIVE)


def test_levels_give_different_forms_only_through_text() -> None:
    body = chat("Hello, World ")
    assert canon(body, Level.EXACT)["messages"][0]["content"] == "Hello, World "
    assert canon(body, Level.NORMALIZED)["messages"][0]["content"] == "Hello, World"
    assert canon(body, Level.AGGRESSIVE)["messages"][0]["content"] == "hello world"


def test_level_may_be_passed_as_its_string_value() -> None:
    assert canonicalize(CHAT, chat("a "), "normalized") == canonicalize(CHAT, chat("a "), Level.NORMALIZED)  # type: ignore[arg-type]


PROMPTS = [
    ("string prompt", {"prompt": " Hi\r\n"}, {"prompt": "Hi"}),
    ("list of strings", {"prompt": [" a", "b\u200b"]}, {"prompt": ["a", "b"]}),
    ("token ids untouched", {"prompt": [1, 2.0, 3]}, {"prompt": [1, 2, 3]}),
    ("token id batches untouched", {"prompt": [[1, 2], [3]]}, {"prompt": [[1, 2], [3]]}),
    ("echo false and best_of 1 elided", {"prompt": "a", "echo": False, "best_of": 1}, {"prompt": "a"}),
    ("logprobs null elided", {"prompt": "a", "logprobs": None}, {"prompt": "a"}),
    ("logprobs 0 kept", {"prompt": "a", "logprobs": 0}, {"prompt": "a", "logprobs": 0}),
    ("max_tokens 16 kept", {"prompt": "a", "max_tokens": 16}, {"prompt": "a", "max_tokens": 16}),
    (
        "max_completion_tokens not renamed",
        {"prompt": "a", "max_completion_tokens": 3},
        {"prompt": "a", "max_completion_tokens": 3},
    ),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in PROMPTS], ids=[c[0] for c in PROMPTS])
def test_completions_prompt_at_normalized(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert canon(body, Level.NORMALIZED, endpoint="completions") == expected


EMBEDDINGS = [
    ("string input", {"model": "e", "input": "Hi \u200b"}, {"model": "e", "input": "Hi"}),
    ("list input", {"model": "e", "input": ["a ", " b"]}, {"model": "e", "input": ["a", "b"]}),
    ("token input untouched", {"model": "e", "input": [[5, 6]]}, {"model": "e", "input": [[5, 6]]}),
    (
        "float encoding elided",
        {"model": "e", "input": "a", "encoding_format": "float"},
        {"model": "e", "input": "a"},
    ),
    (
        "base64 encoding kept",
        {"model": "e", "input": "a", "encoding_format": "base64"},
        {"model": "e", "input": "a", "encoding_format": "base64"},
    ),
    ("user dropped", {"model": "e", "input": "a", "user": "u"}, {"model": "e", "input": "a"}),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in EMBEDDINGS], ids=[c[0] for c in EMBEDDINGS])
def test_embeddings_input_at_normalized(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert canon(body, Level.NORMALIZED, endpoint="embeddings") == expected


def test_unknown_fields_are_kept_with_normalized_numbers() -> None:
    assert canon(chat(top_k=40.0, repetition_penalty=1.1, extra={"b": [1.0]}))["extra"] == {"b": [1]}
    assert canon(chat(top_k=40.0))["top_k"] == 40


def test_input_is_not_mutated() -> None:
    body = chat([{"type": "text", "text": " Hi\u200b "}], stream=True, stop=["x"], max_completion_tokens=5.0)
    before = copy.deepcopy(body)
    result = canon(body, Level.AGGRESSIVE)
    assert body == before
    result["messages"].append("x")
    assert body == before
