"""Structured outputs over HTTP: `response_format` by grammar-constrained decoding, with the tiny random model.

Random weights would never write JSON on their own, so a parsed, valid object is the grammar's doing. The openai
client's `chat.completions.parse` sends a strict json_schema built from a pydantic model and validates the answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import openai
import pytest
from aiohttp.test_utils import TestClient
from pydantic import BaseModel, Field

from backend.server.state import GRAMMARS_KEY
from tests.backend.tiny_server import openai_client, tiny_server

MESSAGES: Any = [{"role": "user", "content": "Describe the weather as JSON."}]


class Weather(BaseModel):
    sunny: bool
    sky: Literal["blue", "grey", "black"]
    word: str = Field(max_length=6)
    tags: list[Literal["warm", "cold"]] = Field(max_length=2)


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with tiny_server() as c:
        yield c


@pytest.fixture
def api(client: TestClient) -> openai.AsyncOpenAI:
    return openai_client(client)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 5}])
async def test_parse_with_a_pydantic_model_gives_a_valid_object(
    api: openai.AsyncOpenAI, sampling: dict[str, Any]
) -> None:
    reply = await api.chat.completions.parse(
        model="tiny", messages=MESSAGES, response_format=Weather, max_tokens=120, **sampling
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Weather)
    assert Weather.model_validate_json(choice.message.content or "") == choice.message.parsed


async def test_without_the_grammar_the_model_writes_no_json(api: openai.AsyncOpenAI) -> None:
    reply = await api.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=40)
    with pytest.raises(ValueError):
        json.loads(reply.choices[0].message.content or "")


async def test_json_object_answers_an_object_and_streams_the_same(api: openai.AsyncOpenAI) -> None:
    # random weights never close a string on their own (json_object bounds nothing): favour '"' and '}', and the
    # grammar must still place ':' and the value between them
    kwargs: Any = {
        "model": "tiny",
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 60,
        "response_format": {"type": "json_object"},
        "logit_bias": {str(ord('"')): 20, str(ord("}")): 10},
    }
    reply = await api.chat.completions.create(**kwargs)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and isinstance(json.loads(choice.message.content or ""), dict)
    stream = await api.chat.completions.create(**kwargs, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == choice.message.content


async def test_an_unbounded_grammar_that_runs_out_says_length(api: openai.AsyncOpenAI) -> None:
    reply = await api.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=30, response_format={"type": "json_object"}
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and (choice.message.content or "").startswith("{")
    with pytest.raises(ValueError):
        json.loads(choice.message.content or "")


async def test_running_out_of_tokens_mid_json_is_a_length_finish_not_a_silent_one(
    api: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        await api.chat.completions.parse(
            model="tiny", messages=MESSAGES, response_format=Weather, max_tokens=5, temperature=0
        )


async def test_grammars_are_compiled_once_and_bad_schemas_are_400s(
    client: TestClient, api: openai.AsyncOpenAI
) -> None:
    for _ in range(3):
        await api.chat.completions.parse(
            model="tiny", messages=MESSAGES, response_format=Weather, max_tokens=120, temperature=0
        )
    compiler = client.app[GRAMMARS_KEY]
    assert compiler.compiled_total == 1 and len(compiler) == 1
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "nonsense"}, "strict": True},
    }
    with pytest.raises(openai.BadRequestError) as caught:
        await api.chat.completions.create(model="tiny", messages=MESSAGES, response_format=bad)  # type: ignore[arg-type]
    assert caught.value.param == "response_format"


PERSON: Any = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "country": {"enum": ["FR", "NO", "JP"]}},
    "required": ["country", "name"],
    "additionalProperties": False,
}


async def test_the_answer_follows_the_declared_property_order(api: openai.AsyncOpenAI) -> None:
    """OpenAI: outputs are produced in the order of the schema's keys; a schema declaring `name` before
    `country` is answered `{"name":...,"country":...}`, and the reversed declaration the other way."""
    country_first = {**PERSON, "properties": dict(reversed(PERSON["properties"].items()))}
    for schema in (PERSON, country_first):
        response_format: Any = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
        reply = await api.chat.completions.create(
            model="tiny", messages=MESSAGES, temperature=0, max_tokens=60, response_format=response_format
        )
        answer = json.loads(reply.choices[0].message.content or "")
        assert list(answer) == list(schema["properties"]) and answer["country"] in ("FR", "NO", "JP")
