"""Tests for gateway/keys/canonical.py, where key order is kept: sorted only where no upstream reads it (the
request's fields, each message's and content part's own keys, `logit_bias`, `metadata`), kept everywhere else
(tools, schemas, engine extras, unknown nested values), since engines render tools and generate schema properties in
the order given. The property test with its mutation checks: test_canonical_json.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gateway.keys.canonical import Level, canonicalize
from gateway.keys.derive import derive_key

CHAT = "chat/completions"


def chat(content: Any = "Hello", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


def canon(body: Any, endpoint: str = CHAT) -> dict[str, Any]:
    return canonicalize(endpoint, body, Level.EXACT)


Order = Callable[[dict[str, Any]], dict[str, Any]]
PROPS = {"name": {"type": "string"}, "country": {"type": "string"}}


def same(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj)


def flip(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(reversed(obj.items()))


def schema(o: Order) -> dict[str, Any]:
    return {"type": "object", "properties": o(PROPS), "required": ["country", "name"]}


def tool(o: Order) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": schema(o)}}


def fmt(o: Order) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": schema(o)}}


def responses(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hi", **fields}


def key_of(body: dict[str, Any], endpoint: str = CHAT) -> str:
    form = canon(body, endpoint=endpoint)
    return derive_key(
        scope="pub", endpoint=endpoint, level=Level.EXACT, model_revision="r", canonical=form
    ).key


# Each builder makes a request from an ordering; `same` and `flip` give two requests equal as JSON.
# Engines render tools into the prompt and generate schema properties in the order given: apart.
ORDER_APART: list[tuple[str, str, Callable[[Order], dict[str, Any]]]] = [
    ("response_format properties", CHAT, lambda o: chat(response_format=fmt(o))),
    ("tool parameters", CHAT, lambda o: chat(tools=[tool(o)])),
    ("a tool's own keys", CHAT, lambda o: chat(tools=[o(tool(same))])),
    ("legacy functions", CHAT, lambda o: chat(functions=[{"name": "f", "parameters": schema(o)}])),
    ("guided_json extra", CHAT, lambda o: chat(guided_json=schema(o))),
    ("structured_outputs extra", CHAT, lambda o: chat(structured_outputs={"json": schema(o)})),
    ("unknown nested object", CHAT, lambda o: chat(extra=o({"b": 1, "a": 2}))),
    ("an assistant's tool call", CHAT, lambda o: chat() | {"messages": [{"role": "assistant", "tool_calls": [o({"id": "c", "type": "function"})]}]}),
    ("completions guided_json", "completions", lambda o: {"prompt": "x", "guided_json": schema(o)}),
    ("responses text.format", "responses", lambda o: responses(text={"format": {"type": "json_schema", "schema": schema(o)}})),
    ("responses tools", "responses", lambda o: responses(tools=[{"type": "function", "name": "f", "parameters": schema(o)}])),
]  # fmt: skip


@pytest.mark.parametrize(("endpoint", "build"), [c[1:] for c in ORDER_APART], ids=[c[0] for c in ORDER_APART])
def test_key_order_the_model_sees_keeps_requests_apart(endpoint: str, build: Callable[[Order], Any]) -> None:
    a, b = build(same), build(flip)
    assert canon(a, endpoint) == canon(b, endpoint)  # equal as JSON: only the order differs
    assert key_of(a, endpoint) != key_of(b, endpoint)


PARTS = [{"type": "text", "text": "Hi"}]
ITEMS = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
# No upstream reads these in order: one key.
ORDER_SHARED: list[tuple[str, str, Callable[[Order], dict[str, Any]]]] = [
    ("top-level fields", CHAT, lambda o: o(chat(seed=1, tools=[tool(same)]))),
    ("message keys and content parts", CHAT, lambda o: chat() | {"messages": [o({"role": "user", "name": "n", "content": [o(p) for p in PARTS]})]}),
    ("logit_bias", CHAT, lambda o: chat(logit_bias=o({"5": 1, "3": -1}))),
    ("responses metadata", "responses", lambda o: responses(metadata=o({"a": "1", "b": "2"}))),
    ("responses input items and parts", "responses", lambda o: responses(input=[o({**i, "content": [o(p) for p in i["content"]]}) for i in ITEMS])),
    ("completions fields", "completions", lambda o: o({"prompt": "x", "model": "m", "seed": 1})),
]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoint", "build"), [c[1:] for c in ORDER_SHARED], ids=[c[0] for c in ORDER_SHARED]
)
def test_key_order_no_upstream_reads_shares_a_key(endpoint: str, build: Callable[[Order], Any]) -> None:
    assert key_of(build(same), endpoint) == key_of(build(flip), endpoint)


def test_the_canonical_form_keeps_the_declared_property_order() -> None:
    form = canon(chat(response_format=fmt(same), tools=[tool(flip)]))
    assert list(form["response_format"]["json_schema"]["schema"]["properties"]) == ["name", "country"]
    assert list(form["tools"][0]["function"]["parameters"]["properties"]) == ["country", "name"]
    assert list(form) == sorted(form) and list(form["messages"][0]) == ["content", "role"]
