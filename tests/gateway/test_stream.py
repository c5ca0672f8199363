"""End-to-end streamed completions (gateway.misses.streaming) through a real gateway and the scriptable fake upstream.

Ordering is driven by the fake's per-chunk gates and by reading events, never by wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from gateway.keys.entry import Entry
from harness.gateway import FakeClock, RunningGateway
from tests.gateway.conftest import AUTH_A, AUTH_B, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tests.support.transports import DeadUpstream

STREAM = {**CHAT, "stream": True}


async def post(gw: RunningGateway, body: dict[str, Any], path: str = "/v1/chat/completions"):
    return await gw.client.post(path, json=body, headers=AUTH_A)


async def sse(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """Data payloads (and `:` comments) in arrival order."""
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: "):
            yield line[6:]
        elif line.startswith(":"):
            yield line


async def collect(resp: aiohttp.ClientResponse) -> list[str]:
    return [e async for e in sse(resp)]


def text_of(events: list[str]) -> str:
    out = []
    for e in events:
        if e.startswith("{"):
            for choice in orjson.loads(e).get("choices", []):
                out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(out)


async def stored(gw: RunningGateway, key: str) -> Entry | None:
    found = await gw.state.cache.get(key)
    return found.entry if found else None


async def test_streamed_miss_then_hit_replay_the_same_events(gw: RunningGateway, fake: FakeUpstream) -> None:
    miss = await post(gw, STREAM)
    miss_events = await collect(miss)
    hit = await post(gw, STREAM)
    hit_events = await collect(hit)

    assert fake.calls["chat"] == 1
    assert fake.headers[0]["Authorization"] == "Bearer tenant-a-key"
    assert fake.headers[0]["Accept-Encoding"] == "identity"
    assert miss_events[-1] == hit_events[-1] == "[DONE]"
    assert hit_events == miss_events  # the recorded chunk boundaries, ids and created
    assert text_of(hit_events) == "Hello, world!"
    assert miss.headers["Content-Type"] == hit.headers["Content-Type"] == "text/event-stream"
    assert miss.headers["X-Accel-Buffering"] == hit.headers["X-Accel-Buffering"] == "no"
    assert miss.headers["Cache-Status"] == "tokenedge; fwd=miss; detail=exact"
    assert miss.headers["Cache-Control"] == "no-cache"
    assert miss.headers["CDN-Cache-Control"] == miss.headers["Surrogate-Control"] == "no-store"
    assert hit.headers["Cache-Status"].startswith("tokenedge; hit; ttl=3600")
    assert hit.headers["X-Cache-Key"] == miss.headers["X-Cache-Key"]
    assert hit.headers["Cache-Control"] == "private" and "ETag" in hit.headers
    assert "Content-Encoding" not in hit.headers


async def test_stream_recorded_entry_serves_json_and_json_recorded_serves_a_stream(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    await collect(await post(gw, STREAM))
    as_json = await (await post(gw, CHAT)).json()
    other = {**CHAT, "messages": [{"role": "user", "content": "And 3+3?"}]}
    first = await (await post(gw, other)).json()
    as_stream = await collect(await post(gw, {**other, "stream": True}))

    assert fake.calls["chat"] == 2
    assert as_json["object"] == "chat.completion"
    assert as_json["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world!"}
    assert as_json["choices"][0]["finish_reason"] == "stop"
    chunks = [orjson.loads(e) for e in as_stream[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert text_of(as_stream) == first["choices"][0]["message"]["content"]
    assert "usage" not in chunks[-1]


async def test_include_usage_is_per_request_on_the_hit(gw: RunningGateway, fake: FakeUpstream) -> None:
    with_usage = {**STREAM, "stream_options": {"include_usage": True}}
    miss = await collect(await post(gw, with_usage))
    plain = await collect(await post(gw, STREAM))
    again = await collect(await post(gw, with_usage))

    assert fake.calls["chat"] == 1
    assert orjson.loads(miss[-2])["usage"]["total_tokens"] == 14
    assert again == miss
    assert all("usage" not in orjson.loads(e) for e in plain[:-1])
    assert len(plain) == len(miss) - 1


async def test_json_recorded_entry_synthesizes_usage_and_rechunks(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(stream={"replay_chunk_chars": 4})
    first = await (await post(gw, CHAT)).json()
    events = await collect(await post(gw, {**STREAM, "stream_options": {"include_usage": True}}))
    content = first["choices"][0]["message"]["content"]
    pieces = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in events[1:-3]]

    assert pieces == [content[i : i + 4] for i in range(0, len(content), 4)]
    assert orjson.loads(events[-2]) == {
        **{k: first[k] for k in ("id", "created", "model")},
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": first["usage"],
    }


async def test_the_first_event_reaches_the_client_before_the_upstream_sends_its_last(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.stream_gates = [asyncio.Event() for _ in range(6)]
    fake.stream_gates[0].set()
    resp = await post(gw, STREAM)
    events = sse(resp)
    first = await anext(events)

    assert fake.chunks_sent == []  # the upstream is still holding chunk 1 back
    assert orjson.loads(first)["choices"][0]["delta"]["role"] == "assistant"
    for gate in fake.stream_gates:
        gate.set()
    rest = [e async for e in events]
    assert rest[-1] == "[DONE]"
    assert text_of(rest) == "Hello, world!"


async def test_heartbeats_cover_upstream_silences(make_gateway: GatewayFactory, fake: FakeUpstream) -> None:
    gw = await make_gateway(stream={"heartbeat_s": 0.02})
    fake.stream_gates = [asyncio.Event() for _ in range(2)]
    fake.stream_gates[0].set()
    resp = await post(gw, STREAM)
    events = sse(resp)
    assert (await anext(events)).startswith("{")
    assert await anext(events) == ": keep-alive"  # the upstream holds chunk 1: silence
    fake.stream_gates[1].set()
    rest = [e async for e in events if not e.startswith(":")]
    assert rest[-1] == "[DONE]"


async def test_twenty_concurrent_streamed_misses_share_one_upstream_stream(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.stream_gates = [asyncio.Event() for _ in range(6)]
    fake.stream_gates[0].set()
    leader = await post(gw, STREAM)
    leader_events = sse(leader)
    first = await anext(leader_events)  # the stream is in flight, one event sent
    followers = await asyncio.gather(*(post(gw, STREAM) for _ in range(19)))
    reading = [asyncio.create_task(collect(r)) for r in followers]
    for gate in fake.stream_gates:
        gate.set()
    sequences = [[first, *[e async for e in leader_events]], *await asyncio.gather(*reading)]

    assert fake.calls["chat"] == 1
    assert all(seq == sequences[0] for seq in sequences)
    assert sequences[0][-1] == "[DONE]" and text_of(sequences[0]) == "Hello, world!"
    assert sum("collapsed" in r.headers["Cache-Status"] for r in followers) == 19
    assert len(gw.state.stream_flights) == 0


async def test_leader_disconnect_does_not_stop_the_followers(gw: RunningGateway, fake: FakeUpstream) -> None:
    fake.stream_gates = [asyncio.Event() for _ in range(6)]
    fake.stream_gates[0].set()
    leader = await post(gw, STREAM)
    await anext(sse(leader))
    follower = await post(gw, STREAM)
    follower_events = sse(follower)
    await anext(follower_events)
    leader.close()
    for gate in fake.stream_gates:
        gate.set()
    rest = [e async for e in follower_events]

    assert rest[-1] == "[DONE]" and text_of(rest) == "Hello, world!"
    assert await stored(gw, follower.headers["X-Cache-Key"]) is not None


async def test_upstream_drop_mid_stream_is_an_error_event_and_nothing_is_stored(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.stream_fail_after = 2
    resp = await post(gw, STREAM)
    events = await collect(resp)
    assert resp.status == 200
    assert orjson.loads(events[-1])["error"]["type"] == "upstream_error"
    assert text_of(events[:-1]) == "Hello"
    assert await stored(gw, resp.headers["X-Cache-Key"]) is None
    fake.stream_fail_after = None
    again = await post(gw, STREAM)
    assert (await collect(again))[-1] == "[DONE]"
    assert fake.calls["chat"] == 2


async def test_a_stream_without_done_or_with_an_error_event_is_not_stored(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.stream_no_done = True
    resp = await post(gw, STREAM)
    events = await collect(resp)
    assert "without [DONE]" in orjson.loads(events[-1])["error"]["message"]
    fake.stream_no_done = False
    fake.stream_error_after = 3
    errored = await collect(await post(gw, STREAM))
    assert orjson.loads(errored[-2])["error"]["message"] == "model overloaded"
    assert await stored(gw, resp.headers["X-Cache-Key"]) is None
    assert fake.calls["chat"] == 2


async def test_content_filtered_streams_are_not_stored(gw: RunningGateway, fake: FakeUpstream) -> None:
    fake.finish_reason = "content_filter"
    resp = await post(gw, STREAM)
    assert (await collect(resp))[-1] == "[DONE]"
    assert await stored(gw, resp.headers["X-Cache-Key"]) is None


async def test_tool_call_stream_is_assembled_and_replayed(gw: RunningGateway, fake: FakeUpstream) -> None:
    fake.stream_tool_calls = True
    miss = await collect(await post(gw, STREAM))
    as_json = await (await post(gw, CHAT)).json()
    hit = await collect(await post(gw, STREAM))

    assert fake.calls["chat"] == 1
    assert as_json["choices"][0]["message"]["tool_calls"] == [FakeUpstream._tool_call()]
    assert as_json["choices"][0]["message"]["content"] is None
    assert as_json["choices"][0]["finish_reason"] == "tool_calls"
    assert hit == miss


async def test_text_completion_streams_are_recorded_and_replayed(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    body = {"model": "test-model", "prompt": "Say hi", "temperature": 0, "stream": True}
    miss = await collect(await post(gw, body, "/v1/completions"))
    hit = await collect(await post(gw, body, "/v1/completions"))
    as_json = await (await post(gw, {**body, "stream": False}, "/v1/completions")).json()
    assert fake.calls["completions"] == 1
    assert hit == miss and text_of(hit) == "Hello, world!"
    assert as_json["object"] == "text_completion" and as_json["choices"][0]["text"] == "Hello, world!"


async def test_upstream_status_errors_pass_through_before_the_first_byte(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.status = 429
    resp = await post(gw, STREAM)
    assert resp.status == 429
    assert (await resp.json())["error"]["message"] == "forced 429"
    assert resp.headers["Cache-Control"] == "no-store"
    assert "detail=status" in resp.headers["Cache-Status"]


async def test_refused_upstream_is_a_502_or_a_stale_stream(
    make_gateway: GatewayFactory, clock: FakeClock
) -> None:
    gw = await make_gateway(cache={"stale_if_error_s": 600})
    first = await collect(await post(gw, STREAM))
    gw.state.upstream = dead = DeadUpstream()
    clock.advance(3600 + 100)
    stale = await post(gw, STREAM)
    assert await collect(stale) == first
    assert "detail=stale-if-error" in stale.headers["Cache-Status"]
    assert stale.headers["Cache-Control"] == "no-store"
    clock.advance(600)
    gone = await post(gw, STREAM)
    assert gone.status == 502
    assert (await gone.json())["error"]["code"] == "upstream_unavailable"
    assert dead.calls == 2  # the stale answer asked the upstream first


async def test_streamed_results_are_counted(gw: RunningGateway) -> None:
    await collect(await post(gw, STREAM))
    await collect(await post(gw, STREAM))
    gw.state.metrics.tally.flush()  # what a scrape does first
    requests = gw.state.metrics.requests
    assert requests.labels("chat/completions", "miss", "stored")._value.get() == 1
    assert requests.labels("chat/completions", "hit", "l1")._value.get() == 1
    assert gw.state.metrics.ttft.labels("chat/completions", "hit")._sum.get() > 0


async def test_a_stale_stream_after_a_5xx_is_labelled_as_the_json_path_labels_it(
    make_gateway: GatewayFactory, fake: FakeUpstream, clock: FakeClock
) -> None:
    gw = await make_gateway(cache={"stale_if_error_s": 600})
    first = await collect(await post(gw, STREAM))
    clock.advance(3600 + 100)
    fake.status = 503
    stale = await post(gw, STREAM)
    assert await collect(stale) == first
    assert "detail=stale-if-error" in stale.headers["Cache-Status"]
    gw.state.metrics.tally.flush()
    requests = gw.state.metrics.requests
    assert requests.labels("chat/completions", "stale", "status")._value.get() == 1


async def test_public_route_stream_follower_is_not_refused_with_the_leaders_credential(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(routes={"chat/completions": {"scope": "public"}})
    fake.denied_tokens = {AUTH_B["Authorization"]}
    fake.gate = asyncio.Event()
    leader = asyncio.create_task(gw.client.post("/v1/chat/completions", json=STREAM, headers=AUTH_B))
    await fake.entered.wait()
    follower = asyncio.create_task(post(gw, STREAM))
    flight = gw.state.stream_flights.values()[0]
    while flight.alive() < 2:
        await asyncio.sleep(0)
    fake.gate.set()
    refused, served = await leader, await follower
    events = await collect(served)
    assert refused.status == 401
    assert served.status == 200 and events[-1] == "[DONE]" and text_of(events) == "Hello, world!"
    assert "collapsed" not in served.headers["Cache-Status"]
    assert fake.calls["chat"] == 2


async def test_tenant_route_stream_followers_share_the_leaders_refusal(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.denied_tokens = {AUTH_A["Authorization"]}
    fake.gate = asyncio.Event()
    leader = asyncio.create_task(post(gw, STREAM))
    await fake.entered.wait()
    follower = asyncio.create_task(post(gw, STREAM))
    flight = gw.state.stream_flights.values()[0]
    while flight.alive() < 2:
        await asyncio.sleep(0)
    fake.gate.set()
    assert [(await leader).status, (await follower).status] == [401, 401]
    assert fake.calls["chat"] == 1  # same credential: one refusal is everyone's answer
