"""The real `openai` package (sync and async clients) against the gateway, streaming and not, over the fake upstream.

The gateway runs on the test's event loop, so the sync client runs in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from harness.gateway import RunningGateway
from tests.support.fake_upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@dataclass
class Answer:
    text: str
    usage: Any = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


def from_chunks(chunks: list[Any]) -> Answer:
    """What a streaming client reassembles: the text, tool calls by index, the finish reason, the usage chunk."""
    answer, calls = Answer(""), {}
    for chunk in chunks:
        if chunk.usage is not None:
            answer.usage = chunk.usage
        for choice in chunk.choices:
            answer.text += choice.delta.content or ""
            answer.finish_reason = choice.finish_reason or answer.finish_reason
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(
                    call.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.id or slot["id"]
                slot["function"]["name"] += call.function.name or ""
                slot["function"]["arguments"] += call.function.arguments or ""
    answer.tool_calls = [calls[i] for i in sorted(calls)] or None
    return answer


def from_completion(completion: Any) -> Answer:
    message = completion.choices[0].message
    calls = [c.model_dump(exclude_none=True) for c in message.tool_calls] if message.tool_calls else None
    return Answer(message.content or "", completion.usage, calls, completion.choices[0].finish_reason)


async def ask(gw: RunningGateway, kind: str, *, stream: bool, **extra: Any) -> Answer:
    args: dict[str, Any] = {"model": "test-model", "messages": MESSAGES, "temperature": 0, **extra}
    if kind == "async":
        async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="tenant-a-key", max_retries=0) as client:
            if not stream:
                return from_completion(await client.chat.completions.create(**args))
            return from_chunks([c async for c in await client.chat.completions.create(**args, stream=True)])

    def sync() -> Answer:
        with OpenAI(base_url=gw.url + "/v1", api_key="tenant-a-key", max_retries=0) as client:
            if not stream:
                return from_completion(client.chat.completions.create(**args))
            return from_chunks(list(client.chat.completions.create(**args, stream=True)))

    return await asyncio.to_thread(sync)


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


@KINDS
async def test_streamed_miss_then_streamed_hit(gw: RunningGateway, fake: FakeUpstream, kind: str) -> None:
    miss = await ask(gw, kind, stream=True)
    hit = await ask(gw, kind, stream=True)
    assert fake.calls["chat"] == 1
    assert hit.text == miss.text == "Hello, world!"
    assert hit.finish_reason == miss.finish_reason == "stop"


@KINDS
async def test_streamed_miss_then_json_hit(gw: RunningGateway, fake: FakeUpstream, kind: str) -> None:
    miss = await ask(gw, kind, stream=True)
    hit = await ask(gw, kind, stream=False)
    assert fake.calls["chat"] == 1
    assert hit.text == miss.text


@KINDS
async def test_json_miss_then_streamed_hit(gw: RunningGateway, fake: FakeUpstream, kind: str) -> None:
    miss = await ask(gw, kind, stream=False)
    hit = await ask(gw, kind, stream=True)
    assert fake.calls["chat"] == 1
    assert hit.text == miss.text and miss.text.startswith("answer #1")


@KINDS
async def test_include_usage_gives_a_usage_chunk_on_the_hit(
    gw: RunningGateway, fake: FakeUpstream, kind: str
) -> None:
    options = {"stream_options": {"include_usage": True}}
    miss = await ask(gw, kind, stream=True, **options)
    hit = await ask(gw, kind, stream=True, **options)
    plain = await ask(gw, kind, stream=True)
    assert fake.calls["chat"] == 1
    assert hit.usage is not None and hit.usage.total_tokens == miss.usage.total_tokens == 14
    assert plain.usage is None


@KINDS
async def test_json_recorded_entry_gives_usage_to_a_streamed_hit(
    gw: RunningGateway, fake: FakeUpstream, kind: str
) -> None:
    await ask(gw, kind, stream=False)
    hit = await ask(gw, kind, stream=True, stream_options={"include_usage": True})
    assert hit.usage is not None and hit.usage.total_tokens == 15


@KINDS
async def test_tool_calls_survive_record_and_replay(
    gw: RunningGateway, fake: FakeUpstream, kind: str
) -> None:
    fake.stream_tool_calls = True
    miss = await ask(gw, kind, stream=True, tools=TOOLS)
    as_json = await ask(gw, kind, stream=False, tools=TOOLS)
    as_stream = await ask(gw, kind, stream=True, tools=TOOLS)
    assert fake.calls["chat"] == 1
    assert miss.tool_calls == as_json.tool_calls == as_stream.tool_calls == [FakeUpstream._tool_call()]
    assert as_json.finish_reason == as_stream.finish_reason == "tool_calls"


@KINDS
async def test_a_stream_cut_by_the_upstream_raises_in_the_client(
    gw: RunningGateway, fake: FakeUpstream, kind: str
) -> None:
    fake.stream_fail_after = 2
    with pytest.raises(openai.APIError, match="closed the connection early"):
        await ask(gw, kind, stream=True)
    fake.stream_fail_after = None
    again = await ask(gw, kind, stream=True)
    assert again.text == "Hello, world!"
    assert fake.calls["chat"] == 2
