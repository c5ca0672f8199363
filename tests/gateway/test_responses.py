"""`POST /v1/responses` cached when stateless: gateway/misses/streaming/responses.py, the policy's Responses rules and the
route, through the real `openai` client against the gateway in front of the fake upstream (OpenAI's event format).

One entry answers both forms: a JSON hit gets the response object, a streamed hit its event sequence (the recorded
events, or the sequence OpenAI streams for a JSON-filled entry). Anything stateful is relayed as a bypass.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI

from gateway.keys.cache_control import RequestDirectives
from gateway.keys.policy import Bypass, Lookup, Reason, RoutePolicy, decide
from gateway.misses.streaming.responses import ResponsesRecorder, events
from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A
from tests.support.fake_upstream import FakeUpstream

ASK: dict[str, Any] = {"model": "test-model", "input": "What is 2+2?", "temperature": 0, "store": False}
OPENAI_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def client(gw: RunningGateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url + "/v1", api_key="tenant-a-key", max_retries=0)


async def create(gw: RunningGateway, **extra: Any) -> tuple[str, Any]:
    """(Cache-Status, the parsed response) of a JSON Responses call."""
    async with client(gw) as c:
        raw = await c.responses.with_raw_response.create(**{**ASK, **extra})
        return raw.headers["Cache-Status"], raw.parse()


async def streamed(gw: RunningGateway, **extra: Any) -> list[Any]:
    async with client(gw) as c:
        return [event async for event in await c.responses.create(**{**ASK, **extra}, stream=True)]


def deduplicated(types: list[str]) -> list[str]:
    """Event types with runs of deltas folded: the recorded stream has one delta per piece, a synthesized one per part."""
    return [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]


# --- the policy, pure ------------------------------------------------------------------------------------------

NONE = RequestDirectives()
ROUTE = RoutePolicy(ttl_s=600)
DECISIONS = [
    ("stateless", ASK, None),
    ("store absent is store true", {k: v for k, v in ASK.items() if k != "store"}, Reason.STATEFUL),
    ("store true", {**ASK, "store": True}, Reason.STATEFUL),
    ("previous response", {**ASK, "previous_response_id": "resp_1"}, Reason.STATEFUL),
    ("a conversation", {**ASK, "conversation": "conv_1"}, Reason.STATEFUL),
    ("a stored prompt", {**ASK, "prompt": {"id": "pmpt_1"}}, Reason.STATEFUL),
    ("background", {**ASK, "background": True}, Reason.STATEFUL),
    ("a hosted tool", {**ASK, "tools": [{"type": "web_search"}]}, Reason.HOSTED_TOOL),
    ("a function tool", {**ASK, "tools": [{"type": "function", "name": "f", "parameters": {}}]}, None),
    ("sampled", {**ASK, "temperature": 0.7}, Reason.TEMPERATURE),
    ("temperature absent is 1", {k: v for k, v in ASK.items() if k != "temperature"}, Reason.TEMPERATURE),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in DECISIONS], ids=[c[0] for c in DECISIONS])
def test_only_stateless_deterministic_responses_are_looked_up(
    body: dict[str, Any], reason: Reason | None
) -> None:
    decision = decide("responses", body, NONE, ROUTE)
    if reason is None:
        assert isinstance(decision, Lookup) and decision.needs_usage
    else:
        assert decision == Bypass(reason)


def test_the_recorder_keeps_the_terminal_response_as_the_body() -> None:
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [],
        "usage": {"total_tokens": 3},
    }
    recorder = ResponsesRecorder(10_000)
    payloads = [orjson.dumps(e) for e in events(response, 0)]
    kinds = [recorder.feed(p) for p in payloads]

    assert kinds[-1].value == "done" and all(k.value == "chunk" for k in kinds[:-1])
    assert recorder.complete and orjson.loads(recorder.body()) == response
    assert recorder.usage == {"total_tokens": 3} and recorder.chunks == payloads


def test_a_stream_without_its_terminal_event_is_not_complete() -> None:
    response = {"id": "r", "object": "response", "status": "completed", "output": [], "usage": {}}
    recorder = ResponsesRecorder(10_000)
    for payload in [orjson.dumps(e) for e in events(response, 0)][:-1]:
        recorder.feed(payload)
    assert not recorder.done and not recorder.complete


# --- through the openai client -------------------------------------------------------------------------------


async def test_a_stateless_response_is_a_hit_the_second_time(gw: RunningGateway, fake: FakeUpstream) -> None:
    miss_status, miss = await create(gw)
    hit_status, hit = await create(gw)

    assert miss_status.startswith("tokenedge; fwd=miss; stored") and hit_status.startswith("tokenedge; hit")
    assert fake.calls["responses"] == 1
    assert hit.id == miss.id and hit.output_text == miss.output_text == "response #1"
    assert hit.usage is not None and hit.usage.total_tokens == 13


async def test_a_streamed_miss_then_a_json_and_a_streamed_hit(gw: RunningGateway, fake: FakeUpstream) -> None:
    miss = await streamed(gw)
    as_json = (await create(gw))[1]
    as_stream = await streamed(gw)

    assert fake.calls["responses"] == 1
    assert [e.type for e in miss] == [e.type for e in as_stream]
    assert deduplicated([e.type for e in miss]) == OPENAI_ORDER
    assert [e.model_dump() for e in as_stream] == [e.model_dump() for e in miss]
    final = miss[-1].response
    assert as_json.id == final.id and as_json.output_text == final.output_text == "Hello, world!"
    assert as_json.usage is not None and as_json.usage.total_tokens == 13


async def test_a_json_filled_entry_streams_openais_event_sequence(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    first = (await create(gw))[1]
    async with client(gw) as c, c.responses.stream(**ASK) as stream:
        types = [event.type async for event in stream]
        final = await stream.get_final_response()  # the SDK's own accumulation of the events

    assert fake.calls["responses"] == 1
    assert types == OPENAI_ORDER
    assert final.id == first.id and final.output_text == first.output_text
    assert final.usage is not None and final.usage.total_tokens == 13


async def test_a_streamed_hit_is_typed_events_without_done(gw: RunningGateway, fake: FakeUpstream) -> None:
    body = {**ASK, "stream": True}
    await (await gw.client.post("/v1/responses", json=body, headers=AUTH_A)).read()
    resp = await gw.client.post("/v1/responses", json=body, headers=AUTH_A)
    raw = await resp.read()

    assert "hit" in resp.headers["Cache-Status"] and resp.headers["Content-Type"] == "text/event-stream"
    assert b"[DONE]" not in raw
    frames = [f for f in raw.split(b"\n\n") if f]
    assert all(f.startswith(b"event: response.") for f in frames)
    assert frames[-1].startswith(b"event: response.completed\ndata: ")


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"store": True}, "stateful"),
        ({"previous_response_id": "resp_0"}, "stateful"),
        ({"tools": [{"type": "web_search"}]}, "hosted-tool"),
        ({"temperature": 0.7}, "temperature"),
    ],
)
async def test_anything_stateful_is_relayed_as_a_bypass(
    gw: RunningGateway, fake: FakeUpstream, extra: dict[str, Any], reason: str
) -> None:
    statuses = [(await create(gw, **extra))[0] for _ in range(2)]

    assert statuses == [f"tokenedge; fwd=bypass; detail={reason}"] * 2
    assert fake.calls["responses"] == 2
    assert all(body.items() >= extra.items() for body in fake.bodies)  # relayed as sent


async def test_an_interrupted_response_stream_is_not_stored(gw: RunningGateway, fake: FakeUpstream) -> None:
    fake.stream_fail_after = 5
    body = {**ASK, "stream": True}
    cut = await (await gw.client.post("/v1/responses", json=body, headers=AUTH_A)).read()
    fake.stream_fail_after = None
    again = await gw.client.post("/v1/responses", json=body, headers=AUTH_A)
    await again.read()

    assert b"response.completed" not in cut and b'"error"' in cut
    assert fake.calls["responses"] == 2 and "hit" not in again.headers["Cache-Status"]


async def test_a_response_cut_at_max_output_tokens_is_stored_as_a_length_finish(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.response_status = "incomplete"
    await create(gw, max_output_tokens=4)
    status, hit = await create(gw, max_output_tokens=4)

    assert status.startswith("tokenedge; hit") and hit.status == "incomplete"
    assert fake.calls["responses"] == 1
