"""`POST /v1/responses` through the `openai` client, with the tiny model: the same answer as the chat path,
`instructions`, incomplete on max_output_tokens, structured text.format, refusals by name. Streaming, stored
responses and function tools are in tests/backend/test_server_responses_state.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from backend.server.response_items import HONOURED, INERT
from tests.backend.test_server_structured import Weather
from tests.backend.tiny_server import openai_client, tiny_server


@pytest.fixture
async def api() -> AsyncIterator[openai.AsyncOpenAI]:
    async with tiny_server(num_blocks=128, max_model_len=1024) as c:
        yield openai_client(c)


async def chat_text(api: openai.AsyncOpenAI, messages: Any) -> tuple[str, str]:
    reply = await api.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=10)
    return reply.choices[0].message.content or "", reply.choices[0].finish_reason


async def test_a_response_is_the_chat_answer(api: openai.AsyncOpenAI) -> None:
    text, finish = await chat_text(
        api, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    )
    response = await api.responses.create(
        model="tiny", instructions="Be brief.", input="Hi there", temperature=0, max_output_tokens=10
    )
    assert response.output_text == text
    assert response.status == ("incomplete" if finish == "length" else "completed")
    if finish == "length":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens > 0


async def test_message_items_with_text_parts(api: openai.AsyncOpenAI) -> None:
    text, _ = await chat_text(api, [{"role": "user", "content": "Hi there"}])
    response = await api.responses.create(
        model="tiny",
        input=[
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}],
            }
        ],
        temperature=0,
        max_output_tokens=10,
    )
    assert response.output_text == text


async def test_text_format_parses_to_a_pydantic_model(api: openai.AsyncOpenAI) -> None:
    response = await api.responses.parse(
        model="tiny", input="Weather?", text_format=Weather, temperature=0, max_output_tokens=120
    )
    assert response.status == "completed" and isinstance(response.output_parsed, Weather)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0]"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"stream": "yes"}, "stream"),
    ],
)
async def test_what_responses_cannot_honour_is_a_400_naming_it(
    api: openai.AsyncOpenAI, extra: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": "tiny", "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        await api.post("/responses", body=body, cast_to=dict)
    assert caught.value.param == param


def test_the_docs_table_names_every_responses_field() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "backend.md").read_text()
    table = docs[docs.index("**`POST /v1/responses`**") : docs.index("- **Tokenizer endpoints**")]
    rows = " ".join(line.split("|")[1] for line in table.splitlines() if line.strip().startswith("| `"))
    assert sorted(f for f in HONOURED | set(INERT) if f"`{f}`" not in rows) == []
