"""Lossless replay (issue 35): a hit carries everything the miss did, in whichever form it is asked.

An upstream that sends every field of the OpenAI chat and completions objects plus the vLLM, SGLang and llama.cpp
extensions (tests/support/rich_upstream.py) fills an entry in one form (JSON, stream); a second request asks in
another (JSON, a plain stream, a stream with `include_usage`). The hit must equal the upstream's own answer in
that form, asked directly, field for field, except what docs/request-flow.md documents: a hit's `id` and `created`
are those of the answer that filled the entry, and a member null or empty in one form may be absent in the other.
Streams are compared as a client reads them: accumulated, the deltas by the `openai` package's own
`accumulate_delta` (an oracle the gateway does not use), the other members by the documented scalar rule.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from openai.lib.streaming._deltas import accumulate_delta

from gateway.misses.streaming import forms
from tests.gateway.conftest import AUTH_A, GatewayFactory
from tests.gateway.test_redis_tier import sample
from tests.support.rich_upstream import RichUpstream

CHAT_REQ = {"model": "rich", "temperature": 0, "messages": [{"role": "user", "content": "Say hello"}]}
TEXT_REQ = {"model": "rich", "temperature": 0, "prompt": "2+2 is"}
ROUTES = {"chat/completions": CHAT_REQ, "completions": TEXT_REQ}
HIT_FORMS = {
    "json": {},
    "stream": {"stream": True},
    "stream+usage": {"stream": True, "stream_options": {"include_usage": True}},
}


@pytest.fixture
async def rich() -> AsyncIterator[tuple[RichUpstream, str]]:
    upstream = RichUpstream()
    server = TestServer(upstream.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield upstream, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def ask(url: str, route: str, body: dict[str, Any]) -> tuple[dict[str, str], Any]:
    """POST `body`; the headers and the parsed answer: a JSON document, or a stream's payloads (without [DONE])."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/{route}", json=body, headers=AUTH_A) as resp,
    ):
        raw = await resp.read()
        headers = dict(resp.headers)
    if not body.get("stream"):
        return headers, orjson.loads(raw)
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return headers, [orjson.loads(e) for e in events[:-1]]


def accumulated(chunks: list[dict[str, Any]], chat: bool) -> dict[str, Any]:
    """A stream as a client reads it: deltas by openai's accumulate_delta, text concatenated, logprob lists
    concatenated, every other member the last value carried that is not null."""
    head: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for name, value in chunk.items():
            if name != "choices" and (value is not None or name not in head):
                head[name] = value
        for raw in chunk["choices"]:
            choice = choices.setdefault(raw["index"], {"delta": {}, "text": ""})
            if chat:
                accumulate_delta(choice["delta"], raw["delta"])
            else:
                choice["text"] += raw["text"]
            for name, value in raw.items():
                if name in ("delta", "text", "index"):
                    continue
                if isinstance(value, dict) and isinstance(choice.get(name), dict):
                    for k, v in value.items():
                        held = choice[name].get(k)
                        choice[name][k] = held + v if isinstance(held, list) and isinstance(v, list) else v
                elif isinstance(value, list) and isinstance(choice.get(name), list):
                    choice[name] = choice[name] + value
                elif value is not None or name not in choice:
                    choice[name] = value
    return {**head, "choices": [choices[i] for i in sorted(choices)]}


def solid(value: Any) -> Any:
    """The value without its null and empty members (documented: either form may leave them out)."""
    if isinstance(value, dict):
        kept = {k: solid(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [solid(v) for v in value]
    return value


def identity(answer: Any, stream: bool) -> tuple[str, int]:
    first = answer[0] if stream else answer
    return first["id"], first["created"]


def as_filled(answer: dict[str, Any], ident: tuple[str, int]) -> dict[str, Any]:
    """The upstream's own answer with the identity of the one that filled the entry (what a hit carries)."""
    return {**answer, "id": ident[0], "created": ident[1]}


@pytest.mark.parametrize("hit_form", list(HIT_FORMS))
@pytest.mark.parametrize("fill_form", ["json", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_hit_in_any_form_equals_the_upstreams_own_answer_in_that_form(
    make_gateway: GatewayFactory, rich: tuple[RichUpstream, str], route: str, fill_form: str, hit_form: str
) -> None:
    upstream, url = rich
    gw = await make_gateway(url)
    request, chat = ROUTES[route], route == "chat/completions"
    fill_body = {**request, **({"stream": True} if fill_form == "stream" else {})}
    hit_body = {**request, **HIT_FORMS[hit_form]}
    _, filled = await ask(gw.url, route, fill_body)
    headers, hit = await ask(gw.url, route, hit_body)
    _, own = await ask(url, route, hit_body)  # the upstream's own answer in the hit's form

    assert upstream.calls == 2 and headers["Cache-Status"].startswith("tokenedge; hit;")
    ident = identity(filled, fill_form == "stream")
    if hit_form == "json":
        assert solid(hit) == solid(as_filled(own, ident))
        assert hit["choices"][0] == own["choices"][0] or fill_form == "stream"  # JSON -> JSON: verbatim
    else:
        assert all(chunk["id"] == ident[0] and chunk["object"] == own[0]["object"] for chunk in hit)
        assert solid(accumulated(hit, chat)) == solid(as_filled(accumulated(own, chat), ident))
        assert (hit[-1]["choices"] == []) is (hit_form == "stream+usage")  # the usage chunk, asked or not
    if fill_form == hit_form == "stream":  # the recorded chunks, byte for byte (identity aside)
        assert hit == [{**chunk, "id": ident[0], "created": ident[1]} for chunk in own]


async def test_a_json_hit_of_a_json_fill_is_the_upstreams_own_bytes(
    make_gateway: GatewayFactory, rich: tuple[RichUpstream, str]
) -> None:
    _, url = rich
    gw = await make_gateway(url)
    async with aiohttp.ClientSession() as session:
        miss = await (
            await session.post(f"{gw.url}/v1/chat/completions", json=CHAT_REQ, headers=AUTH_A)
        ).read()
        hit = await (
            await session.post(f"{gw.url}/v1/chat/completions", json=CHAT_REQ, headers=AUTH_A)
        ).read()
    assert hit == miss and b"reasoning_content" in hit and b"x_meta" in hit


async def test_a_stream_with_an_object_no_rule_merges_serves_streams_only(
    make_gateway: GatewayFactory, rich: tuple[RichUpstream, str]
) -> None:
    upstream, url = rich
    upstream.split_object = True  # `x_meta` arrives in two pieces: how they combine is not known
    gw = await make_gateway(url)
    _, filled = await ask(gw.url, "chat/completions", {**CHAT_REQ, "stream": True})
    stream_headers, replayed = await ask(gw.url, "chat/completions", {**CHAT_REQ, "stream": True})
    json_headers, answer = await ask(gw.url, "chat/completions", CHAT_REQ)

    assert stream_headers["Cache-Status"].startswith("tokenedge; hit;") and replayed == filled
    assert json_headers["Cache-Status"].startswith("tokenedge; fwd=miss; stored; detail=stream-only.")
    assert upstream.calls == 2 and answer["choices"][0]["message"]["x_meta"] == {"k": [1, 2]}
    assert (
        sample(gw, "tokenedge_cache_unfit_misses_total", route="chat/completions", reason="stream-only") == 1
    )


# --- the rules, pure ---------------------------------------------------------------------------------------------


def test_an_object_of_unknown_rule_carried_once_is_exact_and_twice_is_not() -> None:
    once, twice = forms.Assembler("chat/completions"), forms.Assembler("chat/completions")
    for assembler, pieces in ((once, [{"x": {"a": 1}}]), (twice, [{"x": {"a": 1}}, {"x": {"b": 2}}])):
        for delta in pieces:
            assembler.feed({"choices": [{"index": 0, "delta": delta}]})
    assert once.convertible and once.body()["choices"][0]["message"]["x"] == {"a": 1}
    assert not twice.convertible


def test_a_json_answer_survives_the_round_trip_through_its_stream() -> None:
    """JSON -> stream -> JSON gives the JSON back (no member null or empty here), for every chunk size."""
    from tests.support.rich_upstream import chat_json, text_json

    for route, doc in (("chat/completions", chat_json(1, "m")), ("completions", text_json(1, "m"))):
        for chunk_chars in (0, 1, 3):
            assembler = forms.Assembler(route)
            for chunk in forms.stream_of(doc, route, include_usage=True, chunk_chars=chunk_chars):
                assembler.feed(orjson.loads(orjson.dumps(chunk)))
            assert solid(assembler.body()) == solid(doc) and assembler.convertible


def test_the_round_trip_check_sees_a_rule_broken_on_purpose(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation check: strings that no longer concatenate (last piece wins) break the round trip."""
    from tests.support.rich_upstream import chat_json

    original = forms.merge_delta

    def last_wins(acc: dict[str, Any], delta: Any) -> bool:
        for name, value in delta.items():
            if isinstance(value, str) and isinstance(acc.get(name), str):
                acc[name] = ""
        return original(acc, delta)

    monkeypatch.setattr(forms, "merge_delta", last_wins)
    doc = chat_json(1, "m")
    assembler = forms.Assembler("chat/completions")
    for chunk in forms.stream_of(doc, "chat/completions", include_usage=True, chunk_chars=2):
        assembler.feed(chunk)
    assert solid(assembler.body()) != solid(doc)
