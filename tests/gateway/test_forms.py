"""gateway/misses/streaming/forms.py: one rule per kind of field between a JSON answer and its stream.

The property: any JSON answer (chat or completions, known and unknown members at every level, null and empty ones
included) split into its stream and merged back is the same answer, whatever the piece size; each rule broken on
purpose (strings no longer concatenating, scalars taken from the first chunk instead of the one that carries them,
a member left out of the stream) makes the property fail. Calls merged by index, which a JSON answer's stream never
needs (each call is whole in one delta), are checked on streams as engines send them, with their own mutation.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from gateway.misses.streaming import forms

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_name = st.text("abcxyz_", min_size=1, max_size=6).map(lambda s: "x_" + s)  # never a known member
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-100, 100) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_name, inner, max_size=3),
    max_leaves=6,
)
_extras = st.dictionaries(_name, _json, max_size=3)
_call = st.fixed_dictionaries(
    {
        "id": _text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": _text, "arguments": _text}),
    }
)
_message = st.builds(
    lambda content, extra, known: {"role": "assistant", "content": content, **known, **extra},
    st.none() | st.text(min_size=1, max_size=12) | st.just([{"type": "text", "text": "part"}]),
    _extras,
    st.fixed_dictionaries(
        {},
        optional={
            "reasoning_content": _text,
            "tool_calls": st.lists(_call, min_size=1, max_size=3),
            "function_call": st.fixed_dictionaries({"name": _text, "arguments": _text}),
            "audio": st.fixed_dictionaries(
                {"id": _text, "data": _text, "transcript": _text, "expires_at": st.integers(0, 9)}
            ),
            "annotations": st.lists(st.dictionaries(_name, _text, max_size=2), max_size=2),
            "refusal": st.none(),
        },
    ),
)
_logprobs = st.none() | st.fixed_dictionaries(
    {"content": st.lists(st.fixed_dictionaries({"token": _text, "logprob": st.integers(-5, 0)}), max_size=3)}
)


def _choice(chat: bool) -> st.SearchStrategy[dict[str, Any]]:
    text = {"message": _message} if chat else {"text": _text}
    return st.builds(
        lambda index, body, logprobs, finish, extra: {
            "index": index,
            **body,
            "logprobs": logprobs,
            "finish_reason": finish,
            **extra,
        },
        st.integers(0, 2),
        st.fixed_dictionaries(text),
        _logprobs,
        st.sampled_from(["stop", "length", "tool_calls"]),
        _extras,
    )


def _answer(chat: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda choices, extra, usage: {
            "id": "x-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1,
            "model": "m",
            **extra,
            "choices": sorted({c["index"]: c for c in choices}.values(), key=lambda c: c["index"]),
            **usage,
        },
        st.lists(_choice(chat), min_size=1, max_size=2),
        _extras,
        st.fixed_dictionaries(
            {}, optional={"usage": st.fixed_dictionaries({"total_tokens": st.integers(0, 9)})}
        ),
    )


ANSWERS = {
    "route": st.sampled_from(["chat/completions", "completions"]),
    "data": st.data(),
    "chunk_chars": st.integers(0, 4),
}


def round_trip(route: str, data: st.DataObject, chunk_chars: int) -> None:
    doc = data.draw(_answer(route == "chat/completions"))
    assembler = forms.Assembler(route)
    for chunk in forms.stream_of(doc, route, include_usage=True, chunk_chars=chunk_chars):
        assembler.feed(orjson.loads(orjson.dumps(chunk)))  # as the wire carries it
    assert assembler.convertible
    assert assembler.body() == doc


@settings(max_examples=300, deadline=None)
@given(**ANSWERS)
def test_a_json_answer_is_its_stream_merged_back(route: str, data: st.DataObject, chunk_chars: int) -> None:
    round_trip(route, data, chunk_chars)


def fails(monkeypatch: pytest.MonkeyPatch, name: str, broken: Any) -> None:
    """The property, under a rule broken on purpose, finds a counterexample."""
    monkeypatch.setattr(forms, name, broken)
    run = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate])(
        given(**ANSWERS)(round_trip)
    )
    with pytest.raises(AssertionError):
        run()


def test_mutation_strings_that_no_longer_concatenate(monkeypatch: pytest.MonkeyPatch) -> None:
    original = forms.merge_delta

    def last_piece(acc: dict[str, Any], delta: Any) -> bool:
        for name, value in delta.items():
            if isinstance(value, str) and isinstance(acc.get(name), str):
                acc[name] = ""
        return original(acc, delta)

    fails(monkeypatch, "merge_delta", last_piece)


def test_mutation_scalars_from_the_first_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    def first(into: dict[str, Any], name: str, value: Any) -> None:
        into.setdefault(name, value)  # a later chunk's value never replaces the first (a null one)

    fails(monkeypatch, "_scalar", first)


def test_mutation_unknown_members_left_out_of_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    original = forms._chat_deltas

    def known_only(message: Any, chunk_chars: int) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in d.items() if not k.startswith("x_")} for d in original(message, chunk_chars)
        ]

    fails(monkeypatch, "_chat_deltas", known_only)


STREAMS = [
    (
        "tool calls interleaved by index",
        [
            {
                "tool_calls": [
                    {"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": "{"}}
                ]
            },
            {
                "tool_calls": [
                    {"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": "["}}
                ]
            },
            {"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": "]"}}]},
        ],
        {
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "[]"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ]
        },
    ),
    (
        "reasoning, content and the legacy function call concatenate",
        [
            {"role": "assistant", "content": "", "reasoning_content": "a"},
            {"reasoning_content": "b", "content": "c"},
            {"function_call": {"name": "f", "arguments": "{"}},
            {"function_call": {"arguments": "}"}},
        ],
        {"reasoning_content": "ab", "content": "c", "function_call": {"name": "f", "arguments": "{}"}},
    ),
    (
        "an empty content beside a call is null",
        [{"role": "assistant", "content": ""}, {"function_call": {"name": "f", "arguments": ""}}],
        {"content": None, "function_call": {"name": "f", "arguments": ""}},
    ),
]


@pytest.mark.parametrize(("deltas", "expected"), [c[1:] for c in STREAMS], ids=[c[0] for c in STREAMS])
def test_deltas_merge_into_the_message(deltas: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assembler = forms.Assembler("chat/completions")
    for n, delta in enumerate(deltas):
        assembler.feed({"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        assert assembler.convertible, n
    message = assembler.body()["choices"][0]["message"]
    assert {k: message[k] for k in expected} == expected and message["role"] == "assistant"


def test_mutation_calls_concatenated_instead_of_merged_by_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSON answer streams each call whole, so the round trip cannot see this rule: the interleaved case does."""

    def concatenated(held: list[Any], items: list[Any]) -> bool:
        held.extend(items)
        return True

    monkeypatch.setattr(forms, "_merge_list", concatenated)
    with pytest.raises(AssertionError):
        test_deltas_merge_into_the_message(*STREAMS[0][1:])


def test_per_choice_scalars_come_from_the_chunk_that_carries_them() -> None:
    assembler = forms.Assembler("completions")
    for text, stop in (("a", None), ("b", 42), ("", None)):
        assembler.feed({"choices": [{"index": 0, "text": text, "stop_reason": stop, "finish_reason": None}]})
    assembler.feed({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "timings": {"n": 2}})
    choice = assembler.body()["choices"][0]
    assert (choice["text"], choice["stop_reason"], choice["finish_reason"]) == ("ab", 42, "stop")
    assert assembler.body()["timings"] == {"n": 2}


def test_a_chunk_carrying_a_whole_message_makes_the_stream_stream_only() -> None:
    assembler = forms.Assembler("chat/completions")
    assembler.feed({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    assembler.feed({"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "stop"}]})
    assert not assembler.convertible
