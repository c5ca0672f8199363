"""A hit is the whole answer: gateway/misses/streaming/usage.py (the usage ask) and the entry-side checks it serves.

Every cacheable streamed miss asks the upstream for usage, so an entry recorded from a plain stream holds it: a JSON
hit carries `usage` and a streamed hit with `include_usage` ends with the usage chunk, while a client that did not
ask never sees one. Client tests use the real `openai` package against the gateway in front of the fake upstream.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI

from gateway.misses.streaming.usage import asking_usage
from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT
from tests.gateway.test_openai_client import KINDS, MESSAGES, ask
from tests.gateway.test_redis_tier import sample
from tests.gateway.test_stream import STREAM, collect, post, sse, stored
from tests.support.fake_upstream import FakeUpstream

WITH_USAGE = {"stream_options": {"include_usage": True}}
STREAM_USAGE = 14  # the fake upstream's stream usage for the chat request: prompt 10 + completion 4


# --- the ask, pure ---------------------------------------------------------------------------------------------

ASKS = [
    (
        "no stream_options: spliced in",
        b'{"model":"m","stream":true}',
        b'{"stream_options":{"include_usage":true},',
    ),
    ("spaces kept", b' { "model" : "m" }', b' {"stream_options":{"include_usage":true}, "model" : "m" }'),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in ASKS], ids=[c[0] for c in ASKS])
def test_the_ask_is_spliced_into_the_clients_own_bytes(raw: bytes, expected: bytes) -> None:
    forwarded, body = asking_usage(raw, orjson.loads(raw))
    assert forwarded.startswith(expected)
    assert orjson.loads(forwarded) == body and body["stream_options"] == {"include_usage": True}


def test_other_stream_options_are_kept_with_the_ask() -> None:
    raw = b'{"model":"m","stream_options":{"include_usage":false,"continuous_usage_stats":true}}'
    forwarded, body = asking_usage(raw, orjson.loads(raw))
    assert orjson.loads(forwarded)["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    assert body["model"] == "m"


def test_a_request_that_asked_is_forwarded_untouched() -> None:
    raw = b'{"model":"m",  "stream_options":{"include_usage":true}}'
    forwarded, _ = asking_usage(raw, orjson.loads(raw))
    assert forwarded is raw


# --- through the openai client -------------------------------------------------------------------------------


async def stream_chunks(gw: RunningGateway, **extra: Any) -> list[Any]:
    async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="tenant-a-key", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="test-model", messages=MESSAGES, temperature=0, stream=True, **extra
        )
        return [chunk async for chunk in stream]


@KINDS
async def test_a_json_hit_after_a_plain_stream_has_the_upstreams_usage(
    gw: RunningGateway, fake: FakeUpstream, kind: str
) -> None:
    miss = await ask(gw, kind, stream=True)
    hit = await ask(gw, kind, stream=False)

    assert fake.calls["chat"] == 1
    assert fake.bodies[0]["stream_options"] == {
        "include_usage": True
    }  # asked upstream on the client's behalf
    assert miss.usage is None  # ... and not relayed to a client that did not ask
    assert hit.text == miss.text
    assert hit.usage is not None
    assert (hit.usage.prompt_tokens, hit.usage.completion_tokens, hit.usage.total_tokens) == (
        10,
        4,
        STREAM_USAGE,
    )


async def test_a_streamed_hit_with_include_usage_ends_with_the_usage_chunk(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    await stream_chunks(gw)  # a plain stream fills the entry
    hit = await stream_chunks(gw, stream_options={"include_usage": True})

    assert fake.calls["chat"] == 1
    assert hit[-1].choices == [] and hit[-1].usage is not None
    assert hit[-1].usage.total_tokens == STREAM_USAGE
    assert all(chunk.usage is None for chunk in hit[:-1])


async def test_a_plain_stream_gets_no_usage_chunk_on_miss_or_hit(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    miss = await stream_chunks(gw)
    hit = await stream_chunks(gw)

    assert fake.calls["chat"] == 1
    assert [c.usage for c in miss] == [None] * len(miss) and [c.usage for c in hit] == [None] * len(hit)
    assert all(chunk.choices for chunk in miss + hit)  # no usage-only chunk either
    assert "".join(c.choices[0].delta.content or "" for c in hit) == "Hello, world!"


async def test_one_flight_gives_usage_only_to_the_follower_that_asked(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.stream_gates = [asyncio.Event() for _ in range(6)]
    fake.stream_gates[0].set()
    plain = await post(gw, STREAM)  # leads the flight, without include_usage
    plain_events = sse(plain)
    first = await anext(plain_events)
    asking = await post(gw, {**STREAM, **WITH_USAGE})
    reading = asyncio.create_task(collect(asking))
    for gate in fake.stream_gates:
        gate.set()
    plain_seq = [first, *[e async for e in plain_events]]
    asking_seq = await reading

    assert fake.calls["chat"] == 1 and "collapsed" in asking.headers["Cache-Status"]
    assert orjson.loads(asking_seq[-2])["usage"]["total_tokens"] == STREAM_USAGE
    assert all("usage" not in orjson.loads(e) for e in plain_seq[:-1])
    assert [e for e in asking_seq if '"usage"' not in e] == plain_seq


# --- entries without usage -----------------------------------------------------------------------------------


async def test_a_json_answer_without_usage_is_relayed_and_not_stored(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    """Every request a JSON entry could answer as JSON needs usage: relayed, not stored, and Cache-Status says why."""
    fake.omit_usage = True
    first = await post(gw, CHAT)
    await first.read()
    second = await post(gw, CHAT)
    await second.read()

    assert fake.calls["chat"] == 2  # the second went upstream too: nothing was stored
    assert first.headers["Cache-Status"] == "tokenedge; fwd=miss; detail=no-usage.exact"


async def test_a_usage_less_plain_stream_is_stored_and_answers_every_plain_stream(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    """An upstream that ignores `stream_options` (it never sends usage): the stream is stored all the same."""
    fake.omit_usage = True
    first = await post(gw, STREAM)
    miss = await collect(first)
    again = await post(gw, STREAM)
    hit = await collect(again)

    assert fake.calls["chat"] == 1 and hit == miss
    assert again.headers["Cache-Status"].startswith("tokenedge; hit;")
    entry = await stored(gw, first.headers["X-Cache-Key"])
    assert entry is not None and entry.usage is None and entry.stream_chunks is not None


@pytest.mark.parametrize("asks", ["json", "include_usage"])
async def test_a_request_needing_usage_misses_a_usage_less_entry_and_says_why(
    gw: RunningGateway, fake: FakeUpstream, asks: str
) -> None:
    fake.omit_usage = True
    await collect(await post(gw, STREAM))  # stored without usage
    body = CHAT if asks == "json" else {**STREAM, **WITH_USAGE}
    resp = await post(gw, body)
    await (resp.read() if asks == "json" else collect(resp))

    assert fake.calls["chat"] == 2  # a miss: the entry cannot give what the request needs
    assert "fwd=miss" in resp.headers["Cache-Status"]
    assert "detail=no-usage." in resp.headers["Cache-Status"]
    assert sample(gw, "tokenedge_cache_unfit_misses_total", route="chat/completions", reason="no-usage") == 1


async def test_embeddings_without_usage_are_still_cached(gw: RunningGateway, fake: FakeUpstream) -> None:
    """An embeddings entry is the upstream's own JSON, the whole of what any later request gets."""
    fake.omit_usage = True
    body = {"model": "test-model", "input": "hello"}
    first = await (await gw.client.post("/v1/embeddings", json=body, headers=AUTH_A)).json()
    again = await gw.client.post("/v1/embeddings", json=body, headers=AUTH_A)

    assert "hit" in again.headers["Cache-Status"] and await again.json() == first and "usage" not in first
    assert fake.calls["embeddings"] == 1


async def lacking_entry(gw: RunningGateway) -> str:
    """A stored entry, then replaced in L1 by the same entry without usage (as an older gateway stored it)."""
    resp = await post(gw, CHAT)
    await resp.read()
    key = resp.headers["X-Cache-Key"]
    entry = await stored(gw, key)
    assert entry is not None and entry.usage is not None
    gw.state.cache.l1.set(replace(entry, usage=None))
    return key


async def test_an_entry_without_usage_is_a_miss_for_a_json_request(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    key = await lacking_entry(gw)
    resp = await post(gw, CHAT)  # known bytes: the fast lane sees the entry first, then the normal path
    doc = await resp.json()

    assert fake.calls["chat"] == 2
    assert doc["usage"]["total_tokens"] == 15 and doc["choices"][0]["message"]["content"].startswith(
        "answer #2"
    )
    refilled = await stored(gw, key)
    assert refilled is not None and refilled.usage is not None


async def test_an_entry_without_usage_answers_a_plain_stream_but_not_one_asking_for_usage(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    await lacking_entry(gw)
    plain = await collect(await post(gw, STREAM))
    assert fake.calls["chat"] == 1 and plain[-1] == "[DONE]"  # nothing it needs is missing: a hit
    asking = await collect(await post(gw, {**STREAM, **WITH_USAGE}))
    assert fake.calls["chat"] == 2
    assert orjson.loads(asking[-2])["usage"]["total_tokens"] == STREAM_USAGE
