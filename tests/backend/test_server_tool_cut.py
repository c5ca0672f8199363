"""A tool answer over HTTP as it forms (backend/server/reply.py over backend/server/tool_answer.py), through the
`openai` client and the tiny model with its byte tokenizer (one character a token, so `max_tokens` cuts where a
test says): a call cut by `max_tokens` stays a tool call with its partial arguments and `finish_reason: "length"`,
streamed as tool-call deltas that join to the non-streamed reply; `parallel_tool_calls: false` gives exactly one."""

from __future__ import annotations

from typing import Any

import openai

from tests.backend.test_server_tools import MESSAGES, TOOLS
from tests.backend.test_server_tools import api as api
from tests.backend.test_server_tools import client as client

REQUIRED: Any = {"tools": TOOLS[:1], "tool_choice": "required", "parallel_tool_calls": False}
HEAD = '{"tool_calls":[{"name":"get_weather","arguments":'  # the grammar's compact text before the arguments
TOWARDS_MORE_CALLS = {str(ord(",")): 40}  # after a call, `,` opens another where the grammar allows one


async def chat(api: openai.AsyncOpenAI, max_tokens: int, **extra: Any) -> Any:
    return await api.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=max_tokens, **(REQUIRED | extra)
    )


async def joined_stream(
    api: openai.AsyncOpenAI, max_tokens: int
) -> tuple[list[Any], list[dict[str, str]], Any]:
    """Every tool-call delta, the calls they assemble to (by index), and the last finish reason."""
    stream = await chat(api, max_tokens, stream=True)
    deltas: list[Any] = []
    calls: list[dict[str, str]] = []
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            assert choice.delta.content in (None, "")  # a tool answer is never raw JSON in content
            for delta in choice.delta.tool_calls or []:
                deltas.append(delta)
                if delta.id is not None:
                    calls.append({"id": delta.id, "name": delta.function.name, "arguments": ""})
                calls[delta.index]["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return deltas, calls, finish


async def test_a_call_cut_by_max_tokens_keeps_the_tool_call_shape(api: openai.AsyncOpenAI) -> None:
    whole = (await chat(api, 120)).choices[0]
    cut = (await chat(api, len(HEAD) + 6)).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert cut.finish_reason == "length" and cut.message.content is None
    (call,) = cut.message.tool_calls
    full = whole.message.tool_calls[0].function
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert call.function.arguments == full.arguments[:6] and len(full.arguments) > 6


async def test_a_cut_streamed_call_arrives_as_deltas_as_it_forms(api: openai.AsyncOpenAI) -> None:
    cut = (await chat(api, len(HEAD) + 6)).choices[0].message.tool_calls[0].function
    deltas, calls, finish = await joined_stream(api, len(HEAD) + 6)
    assert finish == "length"
    assert [(c["name"], c["arguments"]) for c in calls] == [(cut.name, cut.arguments)]
    assert len(deltas) == 7  # the id and name once the name closes, then one delta per argument character
    assert deltas[0].id.startswith("call_") and deltas[0].function.arguments == ""
    assert all(d.id is None and d.function.name is None for d in deltas[1:])


async def test_a_whole_streamed_call_joins_to_the_non_streamed_one(api: openai.AsyncOpenAI) -> None:
    whole = (await chat(api, 120)).choices[0].message.tool_calls
    deltas, calls, finish = await joined_stream(api, 120)
    assert finish == "tool_calls" and len(deltas) > 2
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (w.function.name, w.function.arguments) for w in whole
    ]


async def test_parallel_tool_calls_false_gives_exactly_one_call(api: openai.AsyncOpenAI) -> None:
    bias: Any = {"logit_bias": TOWARDS_MORE_CALLS}
    many = (await chat(api, 200, parallel_tool_calls=True, **bias)).choices[0]
    one = (await chat(api, 200, parallel_tool_calls=False, **bias)).choices[0]
    assert len(many.message.tool_calls) >= 2  # the bias does open more calls where they are allowed
    assert one.finish_reason == "tool_calls" and len(one.message.tool_calls) == 1
