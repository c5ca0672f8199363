"""Tool calling over HTTP with the tiny random model, through the `openai` client: the grammar makes every call
name a declared function with valid arguments, whatever the weights (backend/server/tools.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from tests.backend.tiny_server import openai_client, tiny_server

MESSAGES: Any = [{"role": "user", "content": "Weather in Oslo?"}]
CITIES = ["Paris", "Oslo"]


def function(name: str, properties: dict[str, Any]) -> Any:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {"type": "function", "function": {"name": name, "parameters": parameters, "strict": True}}


TOOLS = [
    function("get_weather", {"city": {"enum": CITIES}, "unit": {"enum": ["c", "f"]}}),
    function("get_time", {"zone": {"enum": ["utc", "cet"]}}),
]
# favour '"' (so strings close at once) over 'r' or 't' (which of "response" and "tool_calls" auto opens)
TOWARDS_WORDS = {str(ord('"')): 30, str(ord("r")): 20}
TOWARDS_CALLS = {str(ord('"')): 30, str(ord("t")): 20}


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with tiny_server(num_blocks=128, max_model_len=1024) as c:
        yield c


@pytest.fixture
def api(client: TestClient) -> openai.AsyncOpenAI:
    return openai_client(client)


async def chat(api: openai.AsyncOpenAI, **extra: Any) -> Any:
    params: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 120}
    return await api.chat.completions.create(**(params | extra))


def check_weather_call(call: Any) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["city"] in CITIES and arguments["unit"] in ("c", "f") and len(arguments) == 2


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
async def test_required_and_named_choices_always_call(api: openai.AsyncOpenAI, choice: Any) -> None:
    tools = TOOLS[:1] if choice == "required" else TOOLS
    reply = await chat(api, tools=tools, tool_choice=choice, parallel_tool_calls=False)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and message.content is None
    assert len(message.tool_calls) == 1
    check_weather_call(message.tool_calls[0])


async def test_none_answers_as_if_no_tools_were_given(api: openai.AsyncOpenAI) -> None:
    plain = await chat(api, max_tokens=16)
    with_none = await chat(api, max_tokens=16, tools=TOOLS, tool_choice="none")
    assert with_none.choices[0].message.content == plain.choices[0].message.content
    assert with_none.choices[0].message.tool_calls is None


async def test_auto_lets_the_model_choose_words_or_a_call(api: openai.AsyncOpenAI) -> None:
    words = await chat(api, tools=TOOLS[:1], logit_bias=TOWARDS_WORDS)
    assert words.choices[0].finish_reason == "stop" and words.choices[0].message.tool_calls is None
    assert words.choices[0].message.content == ""
    call = await chat(
        api, tools=TOOLS[:1], tool_choice="auto", parallel_tool_calls=False, logit_bias=TOWARDS_CALLS
    )
    assert call.choices[0].finish_reason == "tool_calls"
    check_weather_call(call.choices[0].message.tool_calls[0])


async def test_streamed_tool_calls_arrive_as_deltas(api: openai.AsyncOpenAI) -> None:
    kwargs: Any = {"tools": TOOLS[:1], "tool_choice": "required", "parallel_tool_calls": False}
    whole = (await chat(api, **kwargs)).choices[0].message.tool_calls[0]
    stream = await chat(api, **kwargs, stream=True)
    deltas, finishes = [], []
    async for chunk in stream:
        for c in chunk.choices:
            deltas.extend(c.delta.tool_calls or [])
            finishes.append(c.finish_reason)
    # the id and name first, then the arguments as they are written (tests/backend/test_server_tool_cut.py)
    assert {d.index for d in deltas} == {0} and deltas[0].id.startswith("call_")
    assert deltas[0].function.name == whole.function.name
    assert "".join(d.function.arguments or "" for d in deltas) == whole.function.arguments
    assert finishes[-1] == "tool_calls"


async def test_history_tool_calls_are_rendered_back_as_json(client: TestClient) -> None:
    arguments = json.dumps({"city": "Oslo", "unit": "c"})
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4 C"},
    ]
    resp = await client.post("/tokenize", json={"messages": history})
    text = bytes((await resp.json())["tokens"]).decode()
    # in the grammar's order (name, then arguments) with the arguments as the model wrote them
    assert (
        '<assistant>{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}]}'
        in text
    )
    assert "<tool>4 C" in text
    resp = await client.post(
        "/v1/chat/completions", json={"messages": history, "tools": TOOLS, "max_tokens": 4}
    )
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [function("bad name", {})]}, "tools[0].function.name"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
async def test_bad_tool_requests_are_400s(client: TestClient, extra: dict[str, Any], param: str) -> None:
    resp = await client.post("/v1/chat/completions", json={"messages": MESSAGES, **extra})
    assert resp.status == 400 and (await resp.json())["error"]["param"] == param


def reordered(value: Any) -> Any:
    """The same JSON with every object's members in reverse order."""
    if isinstance(value, dict):
        return {k: reordered(v) for k, v in reversed(value.items())}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


async def test_tool_arguments_follow_the_declared_parameter_order(api: openai.AsyncOpenAI) -> None:
    """The declared order is shown in the prompt and generated by the grammar: two spellings, two orders."""
    kwargs: Any = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    orders = []
    for tools in (TOOLS, reordered(TOOLS)):
        call = (await chat(api, tools=tools, **kwargs)).choices[0].message.tool_calls[0].function
        orders.append(list(json.loads(call.arguments)))
    assert orders == [["city", "unit"], ["unit", "city"]]
