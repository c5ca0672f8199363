"""`/v1/responses` streaming, stored responses and function tools through the `openai` client, with the tiny
model: a stream carries the same text as the whole answer, `previous_response_id` continues the stored
conversation (the model reads the first exchange: the same answer and prompt size as the chat path's), GET and
DELETE, `store: false`, and grammar-bound function calls whose outputs go back in as input items."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.backend.test_server_structured import Weather
from tests.backend.tiny_server import openai_client, tiny_server

GREEDY: Any = {"model": "tiny", "temperature": 0, "max_output_tokens": 10}
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS, "strict": True}
CALL: Any = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}


@pytest.fixture
async def api() -> AsyncIterator[openai.AsyncOpenAI]:
    async with tiny_server(num_blocks=128, max_model_len=1024) as c:
        yield openai_client(c)


async def test_a_stream_carries_the_same_text_in_the_documented_events(api: openai.AsyncOpenAI) -> None:
    whole = await api.responses.create(input="Hi there", **GREEDY)
    stream = await api.responses.create(input="Hi there", stream=True, **GREEDY)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    last = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(deltas) == whole.output_text and whole.output_text
    assert events[-1].response.output_text == whole.output_text and events[-1].response.status == whole.status
    stored = await api.responses.retrieve(events[-1].response.id)  # a clean stream is stored as it ended
    assert stored.model_dump() == events[-1].response.model_dump()


async def test_the_stream_helper_assembles_a_parsed_response(api: openai.AsyncOpenAI) -> None:
    kwargs: Any = {"model": "tiny", "input": "Weather?", "temperature": 0, "max_output_tokens": 120}
    whole = await api.responses.parse(text_format=Weather, **kwargs)
    async with api.responses.stream(text_format=Weather, **kwargs) as stream:
        final = await stream.get_final_response()
    assert final.status == "completed" and final.output_text == whole.output_text
    assert isinstance(final.output_parsed, Weather)


async def test_previous_response_id_continues_the_stored_conversation(api: openai.AsyncOpenAI) -> None:
    first = await api.responses.create(input="Hi there", **GREEDY)
    second = await api.responses.create(input="And again", previous_response_id=first.id, **GREEDY)
    messages: Any = [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And again"},
    ]
    chat = await api.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=10)
    assert second.previous_response_id == first.id
    assert second.output_text == chat.choices[0].message.content
    assert second.usage is not None and chat.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens


async def test_a_stored_response_is_retrieved_then_deleted(api: openai.AsyncOpenAI) -> None:
    created = await api.responses.create(input="Hi there", **GREEDY)
    retrieved = await api.responses.retrieve(created.id)
    assert retrieved.model_dump() == created.model_dump() and created.store is True
    deleted = await api.delete(f"/responses/{created.id}", cast_to=dict)
    assert deleted == {"id": created.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await api.responses.delete(created.id)


async def test_store_false_keeps_nothing(api: openai.AsyncOpenAI) -> None:
    created = await api.responses.create(input="Hi there", store=False, **GREEDY)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        await api.responses.create(input="More", previous_response_id=created.id, **GREEDY)
    assert caught.value.param == "previous_response_id"


async def test_an_unknown_previous_response_id_is_a_404(api: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await api.responses.create(input="Hi", previous_response_id="resp_unknown", **GREEDY)
    assert caught.value.param == "previous_response_id" and "resp_unknown" in caught.value.message


def check_weather_call(item: Any) -> None:
    assert item.type == "function_call" and item.name == "get_weather" and item.call_id.startswith("call_")
    arguments = json.loads(item.arguments)
    assert arguments["city"] in ("Paris", "Oslo") and arguments["unit"] in ("c", "f")


async def test_a_function_tool_is_called_and_its_output_read_back(api: openai.AsyncOpenAI) -> None:
    kwargs: Any = {"model": "tiny", "temperature": 0, "max_output_tokens": 120}
    called = await api.responses.create(input="Weather in Oslo?", **CALL, **kwargs)
    assert called.status == "completed" and len(called.output) == 1
    check_weather_call(called.output[0])
    call = called.output[0]
    answered = await api.responses.create(
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "4 C"}],
        previous_response_id=called.id,
        tools=[WEATHER],
        tool_choice="none",
        **{**kwargs, "max_output_tokens": 10},
    )
    messages: Any = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "4 C"},
    ]
    chat = await api.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=10)
    assert answered.output[0].type == "message"
    assert answered.output_text == chat.choices[0].message.content
    assert answered.usage is not None and chat.usage is not None
    assert answered.usage.input_tokens == chat.usage.prompt_tokens


async def test_a_streamed_function_call_is_the_same_call(api: openai.AsyncOpenAI) -> None:
    kwargs: Any = {"model": "tiny", "input": "Weather in Oslo?", "temperature": 0, "max_output_tokens": 120}
    whole = await api.responses.create(**CALL, **kwargs)
    stream = await api.responses.create(stream=True, **CALL, **kwargs)
    events = [event async for event in stream]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and events[-1].type == "response.completed"
    streamed = events[-1].response.output[0]
    check_weather_call(streamed)
    assert done[0].arguments == streamed.arguments == whole.output[0].arguments
