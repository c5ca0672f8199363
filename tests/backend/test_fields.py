"""The request-field table (backend/server/fields.py): every field is honoured or refused with a 400 naming it,
the table in docs/backend.md lists exactly the same fields, and the real `openai` client sees the refusal."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from backend.server.fields import FIELDS
from tests.backend.test_server import CHAT, FakeEngine, make_app

README = Path(__file__).resolve().parents[2] / "docs" / "backend.md"
COMPLETION = {"model": "tiny", "prompt": "hi", "temperature": 0}
BODIES = {"chat": ("/v1/chat/completions", CHAT), "completion": ("/v1/completions", COMPLETION)}
# a value that asks for something, per refused field
REFUSED_VALUES: dict[str, Any] = {
    "suffix": "tail",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "metadata": {"k": "v"},
    "store": True,
    "prompt_cache_key": "k",
    "service_tier": "flex",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "low",
    "verbosity": "low",
    "web_search_options": {},
}


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(make_app(FakeEngine()))) as c:
        yield c


def test_every_refused_field_has_a_test_value() -> None:
    refused = {name for name, spec in FIELDS.items() if not spec.honoured}
    assert refused == set(REFUSED_VALUES)


def test_readme_table_lists_exactly_the_fields() -> None:
    text = README.read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| (chat|completions|both) \| (yes|no) \|", text, re.MULTILINE)
    assert {name for name, _, _ in rows} == set(FIELDS)
    for name, where, honoured in rows:
        spec = FIELDS[name]
        assert (honoured == "yes") == spec.honoured, name
        expected = (
            "both" if len(spec.endpoints) == 2 else "chat" if "chat" in spec.endpoints else "completions"
        )
        assert where == expected, name


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
async def test_a_refused_field_is_a_400_naming_it(client: TestClient, name: str) -> None:
    endpoint = next(iter(FIELDS[name].endpoints))
    path, body = BODIES[endpoint]
    resp = await client.post(path, json={**body, name: REFUSED_VALUES[name]})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == name and error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_parameter"


@pytest.mark.parametrize(
    ("name", "value"),
    [("store", False), ("metadata", {}), ("tools", []), ("tool_choice", "none"), ("service_tier", "auto")],
)
async def test_an_inert_value_of_a_refused_field_is_accepted(
    client: TestClient, name: str, value: Any
) -> None:
    resp = await client.post("/v1/chat/completions", json={**CHAT, name: value})
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(
    ("path", "body", "name"),
    [
        ("/v1/chat/completions", CHAT, "frobnicate"),
        ("/v1/chat/completions", CHAT, "echo"),  # a completions field sent to chat
        ("/v1/completions", COMPLETION, "response_format"),  # a chat field sent to completions
        ("/v1/completions", COMPLETION, "top_logprobs"),
    ],
)
async def test_an_unknown_field_is_a_400_naming_it(
    client: TestClient, path: str, body: dict, name: str
) -> None:
    resp = await client.post(path, json={**body, name: 1})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == name and error["code"] == "unknown_parameter"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"300": 1}}, "logit_bias"),  # outside the 256-token vocabulary
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
        ({"stop_token_ids": [256]}, "stop_token_ids"),
    ],
)
async def test_bad_values_of_honoured_fields_are_400s(client: TestClient, extra: dict, param: str) -> None:
    resp = await client.post("/v1/chat/completions", json={**CHAT, **extra})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == param, error


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"best_of": 2}, "best_of"), ({"echo": True, "logprobs": 1}, "echo"), ({"logprobs": 21}, "logprobs")],
)
async def test_bad_completion_values_are_400s(client: TestClient, extra: dict, param: str) -> None:
    resp = await client.post("/v1/completions", json={**COMPLETION, **extra})
    assert resp.status == 400 and (await resp.json())["error"]["param"] == param


async def test_the_openai_client_sees_a_refused_field_by_name(client: TestClient) -> None:
    api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        await api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], functions=[{"name": "f"}]
        )
    assert caught.value.param == "functions"
    with pytest.raises(openai.BadRequestError) as caught:
        await api.completions.create(model="tiny", prompt="hi", extra_body={"mirostat": 2})
    assert caught.value.param == "mirostat"
