"""Tool calls hold over varied prompts, not one (#28's acceptance): the 20 prompts of test_server_structured_prompts,
sent together so they batch, each answered with one call whose arguments validate against the tool's schema, for
`tool_choice` required and named, through the real `openai` client and the tiny model."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from tests.backend.test_server_structured_prompts import PROMPTS, messages
from tests.backend.test_server_tools import TOOLS, check_weather_call
from tests.backend.test_server_tools import api as api
from tests.backend.test_server_tools import client as client


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
async def test_tool_calls_validate_for_20_of_20_prompts(api: openai.AsyncOpenAI, choice: Any) -> None:
    tools = TOOLS[:1] if choice == "required" else TOOLS
    replies = await asyncio.gather(
        *(
            api.chat.completions.create(
                model="tiny",
                messages=messages(p),
                temperature=0,
                max_tokens=120,
                tools=tools,
                tool_choice=choice,
                parallel_tool_calls=False,
            )
            for p in PROMPTS
        )
    )
    for reply in replies:
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
        check_weather_call(message.tool_calls[0])


async def test_streamed_tool_calls_assemble_to_the_same_calls_for_20_prompts(api: openai.AsyncOpenAI) -> None:
    kwargs: Any = {
        "tools": TOOLS[:1],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 120,
    }

    async def both(prompt: str) -> tuple[Any, tuple[str, str, str | None]]:
        whole = await api.chat.completions.create(
            model="tiny", messages=messages(prompt), temperature=0, **kwargs
        )
        stream = await api.chat.completions.create(
            model="tiny", messages=messages(prompt), temperature=0, stream=True, **kwargs
        )
        name, arguments, finish = "", "", None
        async for chunk in stream:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    name += delta.function.name or ""
                    arguments += delta.function.arguments or ""
                finish = choice.finish_reason or finish
        return whole.choices[0].message.tool_calls[0], (name, arguments, finish)

    for call, streamed in await asyncio.gather(*(both(p) for p in PROMPTS)):
        check_weather_call(call)
        assert streamed == (call.function.name, call.function.arguments, "tool_calls")
