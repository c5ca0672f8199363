"""Tests for backend/server/tool_answer.py: the grammar-bound tool answer read as it forms. Whatever the chunking,
a stream's pieces join to what the whole text scans to; any cut keeps the tool-call shape with the last call's
arguments a prefix of the model's own text; response text decodes escapes only once whole (property-based, each
property with a mutation check)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from backend.server import tool_answer
from backend.server.tool_answer import AnswerScanner, scan

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=8), st.floats(allow_nan=False)
)
ARGUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
NAMES = st.text("abcdefghijklmnopqrstuvwxyz_-0123456789", min_size=1, max_size=12)
CALLS = st.lists(st.tuples(NAMES, ARGUMENTS), min_size=1, max_size=3)


def answer_text(calls: list[tuple[str, Any]], ascii_only: bool) -> str:
    """The answer as the grammar makes the model write it: compact separators, members in declared order."""
    return json.dumps(
        {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}, ensure_ascii=ascii_only
    )


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def streamed(chunks: list[str]) -> tuple[list[tuple[str, str]], str]:
    """What a stream sends, joined: per call (name, arguments), and the response content."""
    scanner, calls, content = AnswerScanner(), [], ""
    for chunk in chunks:
        progress = scanner.feed(chunk)
        content += progress.content
        for piece in progress.calls:
            if piece.opened:
                assert piece.index == len(calls)
                calls.append((scanner.calls[piece.index].name, ""))
            name, arguments = calls[piece.index]
            calls[piece.index] = (name, arguments + piece.arguments)
    return calls, content


def stream_joins_to_the_whole(calls: list[tuple[str, Any]], cuts: list[int], ascii_only: bool) -> None:
    text = answer_text(calls, ascii_only)
    whole = scan(text)
    assert whole.complete and whole.kind == "calls"
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [(n, a) for n, a in calls]
    assert streamed(chunked(text, cuts)) == ([(c.name, c.arguments) for c in whole.calls], "")


def a_cut_keeps_the_call_shape(calls: list[tuple[str, Any]]) -> None:
    """At every cut: each call whose name has closed is there, the earlier ones whole, the last one's arguments
    a prefix of the model's text."""
    text = answer_text(calls, True)
    whole = scan(text)
    done = [json.dumps({"name": n, "arguments": a}) for n, a in calls]
    ends = [
        len(f'{{"tool_calls": [{"".join(d + ", " for d in done[:k])}{{"name": "{n}", "arguments":')
        for k, (n, _) in enumerate(calls)
    ]
    for cut in range(len(text) + 1):
        part = scan(text[:cut])
        assert len(part.calls) == sum(end <= cut for end in ends)
        for got, full in zip(part.calls, whole.calls, strict=False):
            assert got.name == full.name and full.arguments.startswith(got.arguments)
        assert [c.arguments for c in part.calls[:-1]] == [
            c.arguments for c in whole.calls[: max(0, len(part.calls) - 1)]
        ]
        assert part.complete == (cut >= len(text) - 1)  # the closing `]` completes; `}` is the grammar's


def response_decodes_whole_escapes(words: str, cuts: list[int]) -> None:
    text = json.dumps({"response": words})
    assert streamed(chunked(text, cuts)) == ([], words)
    assert all(words.startswith(scan(text[:cut]).content) for cut in range(len(text) + 1))


CALL_STRATEGIES = {
    "calls": CALLS,
    "cuts": st.lists(st.integers(0, 400), max_size=12),
    "ascii_only": st.booleans(),
}
CUT_STRATEGIES = {"calls": CALLS}
RESPONSE_STRATEGIES = {"words": st.text(max_size=20), "cuts": st.lists(st.integers(0, 200), min_size=1)}
PROPERTIES = [
    (stream_joins_to_the_whole, CALL_STRATEGIES),
    (a_cut_keeps_the_call_shape, CUT_STRATEGIES),
    (response_decodes_whole_escapes, RESPONSE_STRATEGIES),
]


@pytest.mark.parametrize(("prop", "strategies"), PROPERTIES, ids=lambda p: getattr(p, "__name__", ""))
def test_property_holds(prop: Any, strategies: dict[str, Any]) -> None:
    settings(max_examples=150, deadline=None)(given(**strategies)(prop))()


def fails(prop: Any, strategies: dict[str, Any]) -> None:
    """The property, run under a mutation, finds a counterexample (not shrunk: any one will do)."""
    run = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate])(
        given(**strategies)(prop)
    )
    with pytest.raises(AssertionError):
        run()


def test_mutation_strings_ignored_fail_the_stream_property(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value tracker blind to strings ends `{"a": "}"}` at the quoted brace."""
    original = tool_answer._Value.takes

    def blind(self: Any, ch: str) -> bool:
        return original(self, "x" if ch == '"' and self.started else ch)

    monkeypatch.setattr(tool_answer._Value, "takes", blind)
    fails(stream_joins_to_the_whole, CALL_STRATEGIES)


def test_mutation_partial_escapes_decoded_fail_the_response_property(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding a surrogate pair's halves apart yields two lone surrogates, not the character."""
    monkeypatch.setattr(tool_answer, "_HIGH_SURROGATE", tool_answer.re.compile(r"(?!)"))
    fails(response_decodes_whole_escapes, RESPONSE_STRATEGIES)


def test_mutation_calls_opened_late_fail_the_cut_property(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call opened only once its arguments begin is missing from an answer cut right after its name."""
    late = tool_answer.re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*\S')
    monkeypatch.setattr(tool_answer, "_CALL_HEAD", late)
    fails(a_cut_keeps_the_call_shape, CUT_STRATEGIES)


def test_an_answer_cut_before_any_name_has_no_calls_and_no_content() -> None:
    cut = scan('{"tool_calls": [{"name": "get_wea')
    assert cut.kind == "calls" and cut.calls == [] and cut.content == "" and not cut.complete
