"""Against real renderers: requests the gateway keys together render the same prompt, and requests it keys apart
for key order inside tools render different prompts (which is why they must key apart).

Two renderers: our backend's (the protocol's reading of a request, the tools system message of
backend/server/tools.py, tokenedge_wire's sandboxed SmolLM2-135M template, the tokenizer: the prompt ids it feeds
the model) and llama.cpp's `llama-server` (`POST /apply-template`: its own Jinja engine) serving SmolLM2 with a
tool-calling template (Qwen2.5's, tests/gateway/data/qwen25_tools.jinja: tools as `tojson`, calls as `<tool_call>`;
SmolLM2's own template has no tool syntax and llama-server would leave tools out of the prompt). The keys
are computed as the gateway computes them: `exact` (any upstream) and the `tokens` level our backend gets under the
default `auto`. Bounded: a few variants per group, one `/apply-template` call each (no generation).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.loader import default_model_path, gguf_tokenizer
from backend.server.completions import prompts_of
from backend.server.protocol import parse_request
from backend.server.state import ServedModel
from gateway.keys.canonical import Level, canonicalize
from gateway.keys.derive import derive_key
from gateway.tokens.cache import TokenCache
from gateway.tokens.encoder import ModelEncoder
from gateway.tokens.keyform import canonical_form
from gateway.tokens.registry import spec_from_export
from harness.peers.llama_server import LlamaServer, llama_server
from harness.peers.llamacpp_build import ensure_build

CHAT = "chat/completions"
TOOLS_TEMPLATE = Path(__file__).parent / "data" / "qwen25_tools.jinja"
ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
# the first session on a machine may compile llama-server inside this module (`make llama` first)
pytestmark = pytest.mark.timeout(3600)


class Renderers:
    """Both renderers and the gateway's two key levels, for SmolLM2."""

    def __init__(self, llama: LlamaServer) -> None:
        tokenizer = gguf_tokenizer(default_model_path())
        self.llama = llama
        self.served = ServedModel(id=ALIAS, revision="r", tokenizer=tokenizer, max_model_len=2048, created=0)
        self.encoder = ModelEncoder(spec_from_export(tokenizer.export()), TokenCache(1 << 20))

    def keys(self, body: dict[str, Any]) -> tuple[str, str]:
        """(the `exact` key, the key under `auto` in front of our backend: `tokens` where it can render)."""
        exact = canonicalize(CHAT, body, Level.EXACT)
        level, form = canonical_form("auto", CHAT, body, self.encoder)
        return tuple(  # type: ignore[return-value]
            derive_key(scope="pub", endpoint=CHAT, level=lv, model_revision="r", canonical=f).key
            for lv, f in ((Level.EXACT, exact), (level, form))
        )

    def backend_ids(self, body: dict[str, Any]) -> tuple[int, ...]:
        """The prompt ids our backend feeds the model for this request."""
        return tuple(prompts_of(parse_request(body, "chat", 4), self.served)[0].ids)

    def llama_prompt(self, body: dict[str, Any]) -> str:
        """llama-server's rendered prompt (`POST /apply-template`)."""
        request = urllib.request.Request(
            f"{self.llama.url}/apply-template",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            return str(json.loads(resp.read())["prompt"])


@pytest.fixture(scope="module")
def renderers() -> Iterator[Renderers]:
    build = ensure_build()  # BuildUnavailable names the reason: an error, never a skip
    template = ("--chat-template-file", str(TOOLS_TEMPLATE))
    with llama_server(
        build, default_model_path(), alias=ALIAS, slots=1, threads=1, extra_args=template
    ) as server:
        yield Renderers(server)


def flip(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(reversed(obj.items()))


def weather(properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": ["city", "unit"]}
    function = {"name": "get_weather", "description": "The weather in a city.", "parameters": parameters}
    return {"type": "function", "function": function}


PROPERTIES = {
    "city": {"type": "string", "enum": ["Oslo", "Paris"]},
    "unit": {"type": "string", "enum": ["c", "f"]},
}
SYSTEM = {"role": "system", "content": "You are a weather bot."}
USER = {"role": "user", "content": "Weather in Oslo?"}
BASE: dict[str, Any] = {
    "model": ALIAS,
    "messages": [SYSTEM, USER],
    "tools": [weather(PROPERTIES)],
    "temperature": 0,
    "max_tokens": 32,
}
DEFAULTS = {
    "top_p": 1,
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0.0,
    "stop": None,
    "logit_bias": {},
    "seed": None,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "response_format": {"type": "text"},
}
PARTS = [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]

# Each group: requests the gateway keys together (the test checks that premise too).
TOGETHER: dict[str, list[dict[str, Any]]] = {
    "order, defaults, aliases": [
        BASE,
        flip(BASE),  # top-level field order
        {**BASE, "messages": [flip(m) for m in BASE["messages"]]},  # each message's key order
        {**BASE, **DEFAULTS},  # documented defaults spelled out
        {**flip(BASE), **DEFAULTS, "messages": [flip(m) for m in BASE["messages"]]},
        {**{k: v for k, v in BASE.items() if k != "max_tokens"}, "max_completion_tokens": 32},
        {**BASE, "temperature": 0.0, "top_p": 1.0},  # number spelling
    ],
    "content parts": [
        {**BASE, "messages": [SYSTEM, {**USER, "content": PARTS}]},
        {**BASE, "messages": [SYSTEM, flip({**USER, "content": [flip(p) for p in PARTS]})]},
    ],
}


@pytest.mark.parametrize("group", list(TOGETHER))
def test_requests_keyed_together_render_the_same_prompt(renderers: Renderers, group: str) -> None:
    variants = TOGETHER[group]
    assert len({renderers.keys(body) for body in variants}) == 1  # the premise: one key at both levels
    assert len({renderers.backend_ids(body) for body in variants}) == 1
    assert len({renderers.llama_prompt(body) for body in variants}) == 1


def history(arguments: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
    }
    messages = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "4 C"},
    ]
    return {**BASE, "messages": messages}


# Pairs the gateway keys apart, each for a difference both renderers show. (It keys apart more than this: any
# order inside tools, though our backend writes a function's own keys in a fixed order.)
APART: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "tool property order": (BASE, {**BASE, "tools": [weather(flip(PROPERTIES))]}),
    "history call argument order": (history({"city": "Oslo", "unit": "c"}), history({"unit": "c", "city": "Oslo"})),
    "history call arguments": (history({"city": "Oslo", "unit": "c"}), history({"city": "Paris", "unit": "c"})),
}  # fmt: skip


@pytest.mark.parametrize("pair", list(APART))
def test_requests_keyed_apart_for_what_the_model_reads_render_different_prompts(
    renderers: Renderers, pair: str
) -> None:
    a, b = APART[pair]
    exact_a, auto_a = renderers.keys(a)
    exact_b, auto_b = renderers.keys(b)
    assert renderers.backend_ids(a) != renderers.backend_ids(b)
    assert renderers.llama_prompt(a) != renderers.llama_prompt(b)
    assert exact_a != exact_b and auto_a != auto_b  # so the gateway must key them apart, and does
