"""LangChain's standard chat model integration tests (`langchain-tests`) with `ChatOpenAI` pointed at the tiny
backend directly, then at a cold gateway in front of it, then at a gateway whose every request was first sent
as a plain stream, so that it is a hit; the three runs must get the same answers (tool call ids aside: the
backend makes fresh ones).

Tests that fail only because the tiny random model's words are wrong are xfailed by name (docs/backend.md,
"LangChain standard tests")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests

from tests.support.langchain import (
    MODEL,
    AsyncRecordingTransport,
    Recorder,
    RecordingTransport,
    servers,
)

# Tests whose requests and answers have the right shape but whose assertions need a model that understands:
# the tiny model's weights are random, so its words are not the expected ones.
TINY_CONTENT: dict[str, str] = {
    "test_tool_calling": "the tiny model's content: it calls magic_function with a random input, not 3",
    "test_tool_calling_async": "the tiny model's content: it calls magic_function with a random input, not 3",
    "test_bind_runnables_as_tools": "the tiny model's content: its answer_style argument is the empty string",
    "test_json_mode": "the tiny model's content: JSON mode binds a JSON object, and the model's is {}, no joke",
    "test_unicode_tool_call_integration": "the tiny model's content: its string argument has no 你好 in it",
    # Since the grammar follows the schema's declared order (setup before punchline), the random weights write a
    # setup string that runs past max_tokens before the call's name and arguments are whole: finish `length`.
    "test_structured_output_pydantic_2_v1": "the tiny model's content: its setup string runs past max_tokens",
}
# Steers the random weights towards answers that end (the grammar still decides what may come): close objects
# and arrays as soon as their schema allows, close strings at once, and under `auto` pick "tool_calls" over
# "response", as tests/backend/test_server_tools.py does. Without it the model fills the optional members that
# LangChain's open schemas allow until it runs out of tokens.
TOWARDS_ENDINGS = {ord("}"): 30, ord("]"): 30, ord('"'): 25, ord("t"): 20}


def without_call_ids(value: Any) -> Any:
    """`value` without the backend's fresh tool call ids (content blocks carry them in LangChain's v1 output)."""
    if isinstance(value, dict):
        return {k: without_call_ids(v) for k, v in value.items() if not str(v).startswith("call_")}
    if isinstance(value, list):
        return [without_call_ids(v) for v in value]
    return value


class AnswerLog(BaseCallbackHandler):
    """Each chat answer LangChain got (text, tool calls without their ids, usage, finish) under the test's name."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        for generations in response.generations:
            for generation in generations:
                assert isinstance(generation, ChatGeneration)
                message: Any = generation.message
                calls = [(c["name"], c["args"]) for c in getattr(message, "tool_calls", [])]
                usage = dict(getattr(message, "usage_metadata", None) or {})
                # cached prompt tokens count the backend's prefix cache, which each run leaves differently
                usage.pop("input_token_details", None)
                answer = [without_call_ids(message.content), calls, usage]
                answer.append((generation.generation_info or {}).get("finish_reason"))
                self.recorder.answers.setdefault(self.recorder.test, []).append(json.dumps(answer))


@dataclass
class Run:
    """One run's target and what it records, with the HTTP clients every test of the run shares."""

    url: str
    recorder: Recorder
    http_client: httpx.Client


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Run]]:
    with servers() as s:
        urls = {"direct": s.backend.url, "cold": s.cold.url, "warm": s.warm.url}
        recorders = {"direct": Recorder(), "cold": Recorder(), "warm": Recorder(prefill=True)}
        made = {
            name: Run(
                urls[name] + "/v1",
                recorder,
                httpx.Client(transport=RecordingTransport(recorder)),
            )
            for name, recorder in recorders.items()
        }
        yield made
        for run in made.values():
            run.http_client.close()


class StandardRun(ChatModelIntegrationTests):
    run_name = "direct"
    run: Run
    async_client: httpx.AsyncClient

    @pytest.fixture(autouse=True)
    async def _name_the_test(
        self, request: pytest.FixtureRequest, runs: dict[str, Run]
    ) -> AsyncIterator[None]:
        """Points the test at its run; the async client is the test's own, as its event loop is."""
        type(self).run = runs[self.run_name]
        self.run.recorder.test = request.node.name
        if request.node.originalname in TINY_CONTENT:
            request.applymarker(
                pytest.mark.xfail(reason=TINY_CONTENT[request.node.originalname], strict=True)
            )
        async with httpx.AsyncClient(transport=AsyncRecordingTransport(self.run.recorder)) as client:
            type(self).async_client = client
            yield

    @property
    def chat_model_class(self) -> type[ChatOpenAI]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {
            "model": MODEL,
            "base_url": self.run.url,
            "api_key": "langchain-key",
            "temperature": 0,
            "max_tokens": 100,
            "stream_usage": True,
            "max_retries": 0,
            "logit_bias": TOWARDS_ENDINGS,
            "callbacks": [AnswerLog(self.run.recorder)],
            "http_client": self.run.http_client,
            "http_async_client": self.async_client,
        }

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False  # the backend serves one model


class TestBackendDirect(StandardRun):
    run_name = "direct"


class TestGatewayCold(StandardRun):
    run_name = "cold"


class TestGatewayWarm(StandardRun):
    run_name = "warm"


def test_the_gateway_runs_got_the_backends_answers(runs: dict[str, Run]) -> None:
    """After the three runs: the same answers each way, the cold gateway starting empty, every warm request a
    hit."""
    direct, cold, warm = (runs[name].recorder for name in ("direct", "cold", "warm"))
    assert direct.answers, "run the whole module: this compares the runs before it"
    for run in (cold, warm):
        assert {t: sorted(a) for t, a in run.answers.items()} == {
            t: sorted(a) for t, a in direct.answers.items()
        }
    assert cold.statuses["test_invoke"] == ["tokenedge; fwd=miss; stored; detail=tokens"]
    assert all(s.startswith("tokenedge; hit") for test in warm.statuses.values() for s in test), warm.statuses
