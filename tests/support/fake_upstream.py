"""A scriptable OpenAI-compatible upstream for gateway tests (a real HTTP server on loopback).

Every completion it produces carries a serial number, so a byte-identical second answer proves it came from the
cache. Tests steer it through plain attributes: a forced status, a gate that holds responses until released (no
sleeps), SSE streams whose chunks wait on per-chunk events, and failures mid-stream.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclass
class FakeUpstream:
    revision: str = "rev-1"
    status: int | None = None  # force this status on completions
    gate: asyncio.Event | None = None  # completions wait for it (coalescing tests)
    stream_pieces: list[str] = field(default_factory=lambda: ["Hello", ", ", "world", "!"])
    stream_gates: list[asyncio.Event] | None = None  # chunk i waits for stream_gates[i]
    stream_fail_after: int | None = None  # send this many chunks, then drop the connection
    stream_no_done: bool = False  # end the stream cleanly but without [DONE]
    stream_tool_calls: bool = False
    stream_error_after: int | None = (
        None  # send this many chunks, then an OpenAI-style error event and [DONE]
    )
    finish_reason: str = "stop"
    # An upstream that reports no usage: none in JSON, and the stream's usage ask ignored.
    omit_usage: bool = False
    seeded_invariant: bool = False  # /v1/models promises batch-invariant seeded sampling
    retrieve: bool = (
        True  # False: no `GET /v1/models/{id}` route (a 404, as llama.cpp's llama-server answers)
    )
    response_status: str = (
        "completed"  # the Responses answer's status (`incomplete`: cut at max_output_tokens)
    )
    denied_tokens: set[str] = field(default_factory=set)  # Authorization values answered with 401
    calls: Counter[str] = field(default_factory=Counter)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # raw paths of `GET /v1/models/{id}`
    chunks_sent: list[int] = field(default_factory=list)
    serial: itertools.count = field(default_factory=lambda: itertools.count(1))
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)  # as the backend: ids may hold '/' (org/name)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/files", self.files)
        return app

    async def models(self, request: web.Request) -> web.Response:
        self.calls["models"] += 1
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": "test-model",
                        "object": "model",
                        "owned_by": "tokenedge",
                        "tokenedge": {
                            "revision": self.revision,
                            "max_model_len": 2048,
                            **({"seeded_invariant": True} if self.seeded_invariant else {}),
                        },
                    }
                ],
            }
        )

    async def model(self, request: web.Request) -> web.Response:
        """`GET /v1/models/{id}`: the id as this server decoded it, and the raw path it was sent."""
        self.calls["model"] += 1
        self.paths.append(request.raw_path)
        if not self.retrieve:
            raise web.HTTPNotFound(text="File Not Found")
        return web.json_response(
            {"id": request.match_info["model"], "object": "model", "created": 0, "owned_by": "org"}
        )

    async def files(self, request: web.Request) -> web.Response:
        self.calls["files"] += 1
        return web.json_response(
            {"object": "list", "data": [], "echo_auth": request.headers.get("Authorization")}
        )

    async def _enter(self, request: web.Request, name: str) -> dict[str, Any]:
        body = await request.json()
        self.calls[name] += 1
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        return body

    def _forced(self) -> web.Response | None:
        if self.status is None or self.status == 200:
            return None
        return web.json_response(
            {"error": {"message": f"forced {self.status}", "type": "upstream", "param": None, "code": None}},
            status=self.status,
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._enter(request, "chat")
        if request.headers.get("Authorization") in self.denied_tokens:
            return web.json_response(
                {
                    "error": {
                        "message": "invalid api key",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "invalid_api_key",
                    }
                },
                status=401,
            )
        if (forced := self._forced()) is not None:
            return forced
        n = next(self.serial)
        if body.get("stream"):
            return await self._stream(request, body, n)
        last = body["messages"][-1].get("content")
        message: dict[str, Any] = {"role": "assistant", "content": f"answer #{n} to {last!r}"}
        if self.stream_tool_calls:
            message = {"role": "assistant", "content": None, "tool_calls": [self._tool_call()]}
        return web.json_response(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 1700000000 + n,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
                **self._usage({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}),
            }
        )

    def _usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {} if self.omit_usage else {"usage": usage}

    @staticmethod
    def _tool_call() -> dict[str, Any]:
        return {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._enter(request, "completions")
        if (forced := self._forced()) is not None:
            return forced
        n = next(self.serial)
        if body.get("stream"):
            return await self._stream(request, body, n)
        return web.json_response(
            {
                "id": f"cmpl-{n}",
                "object": "text_completion",
                "created": 1700000000 + n,
                "model": body["model"],
                "choices": [
                    {"index": 0, "text": f" completion #{n}", "finish_reason": "stop", "logprobs": None}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self._enter(request, "embeddings")
        n = next(self.serial)
        return web.json_response(
            {
                "object": "list",
                "model": body["model"],
                "data": [{"object": "embedding", "index": 0, "embedding": [n / 10, 0.5]}],
                **self._usage({"prompt_tokens": 2, "total_tokens": 2}),
            }
        )

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/responses` as OpenAI answers it: the response object, or its typed event stream."""
        body = await self._enter(request, "responses")
        if (forced := self._forced()) is not None:
            return forced
        n = next(self.serial)
        text = "".join(self.stream_pieces) if body.get("stream") else f"response #{n}"
        response = self._response(body, n, text)
        if not body.get("stream"):
            return web.json_response(response)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for number, event in enumerate(self._response_events(response)):
            if self.stream_gates is not None and number < len(self.stream_gates):
                await self.stream_gates[number].wait()
            if self.stream_fail_after is not None and number >= self.stream_fail_after:
                assert request.transport is not None
                request.transport.close()
                return resp
            payload = orjson.dumps({"type": event.pop("type"), "sequence_number": number, **event})
            await resp.write(
                b"event: " + orjson.loads(payload)["type"].encode() + b"\ndata: " + payload + b"\n\n"
            )
        await resp.write_eof()
        return resp

    def _response(self, body: dict[str, Any], n: int, text: str) -> dict[str, Any]:
        incomplete = self.response_status == "incomplete"
        return {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 1700000000 + n,
            "status": self.response_status,
            "model": body["model"],
            "output": [
                {
                    "id": f"msg_{n}",
                    "type": "message",
                    "status": self.response_status,
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools", []),
            **self._usage({"input_tokens": 9, "output_tokens": 4, "total_tokens": 13}),
        }

    def _response_events(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The typed events OpenAI streams: created, in_progress, the item and its text deltas, completed."""
        item = response["output"][0]
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        part = {"type": "output_text", "text": "", "annotations": []}
        terminal = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [
            {"type": "response.created", "response": opening},
            {"type": "response.in_progress", "response": opening},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
            },
            {"type": "response.content_part.added", **where, "part": part},
            *({"type": "response.output_text.delta", **where, "delta": p} for p in self.stream_pieces),
            {"type": "response.output_text.done", **where, "text": item["content"][0]["text"]},
            {"type": "response.content_part.done", **where, "part": item["content"][0]},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": terminal, "response": response},
        ]

    def _text_chunks(self, body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        base = {
            "id": f"cmpl-{n}",
            "object": "text_completion",
            "created": 1700000000 + n,
            "model": body["model"],
        }

        def text(piece: str, finish: str | None = None) -> dict[str, Any]:
            return {
                **base,
                "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}],
            }

        out = [text(piece) for piece in self.stream_pieces]
        out.append(text("", self.finish_reason))
        return out + ([] if self.omit_usage else _usage_chunk(base, body, prompt_tokens=3))

    def _chunks(self, body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if "prompt" in body:
            return self._text_chunks(body, n)
        base = {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion.chunk",
            "created": 1700000000 + n,
            "model": body["model"],
        }

        def delta(fields: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}

        out = [delta({"role": "assistant", "content": ""})]
        if self.stream_tool_calls:
            out += [delta({"tool_calls": [call]}) for call in self._tool_call_deltas()]
        else:
            out += [delta({"content": piece}) for piece in self.stream_pieces]
        out.append(delta({}, "tool_calls" if self.stream_tool_calls else self.finish_reason))
        return out + ([] if self.omit_usage else _usage_chunk(base, body, prompt_tokens=10))

    def _tool_call_deltas(self) -> list[dict[str, Any]]:
        """The tool call as OpenAI streams it: id, type and name first, then the arguments in two pieces."""
        call = self._tool_call()
        args = call["function"]["arguments"]
        head = {"index": 0, "id": call["id"], "type": "function"}
        return [
            {**head, "function": {"name": call["function"]["name"], "arguments": ""}},
            *({"index": 0, "function": {"arguments": part}} for part in (args[:8], args[8:])),
        ]

    async def _stream(self, request: web.Request, body: dict[str, Any], n: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sent = 0
        for i, chunk in enumerate(self._chunks(body, n)):
            if self.stream_gates is not None and i < len(self.stream_gates):
                await self.stream_gates[i].wait()
            if self.stream_fail_after is not None and sent >= self.stream_fail_after:
                assert request.transport is not None
                request.transport.close()
                self.chunks_sent.append(sent)
                return resp
            if self.stream_error_after is not None and sent >= self.stream_error_after:
                await resp.write(
                    b'data: {"error": {"message": "model overloaded", "type": "server_error", '
                    b'"param": null, "code": null}}\n\n'
                )
                break
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            sent += 1
        self.chunks_sent.append(sent)
        if not self.stream_no_done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _usage_chunk(base: dict[str, Any], body: dict[str, Any], *, prompt_tokens: int) -> list[dict[str, Any]]:
    """The closing usage-only chunk, when the request asked for it (`stream_options.include_usage`)."""
    if not (body.get("stream_options") or {}).get("include_usage"):
        return []
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 4, "total_tokens": prompt_tokens + 4}
    return [{**base, "choices": [], "usage": usage}]


async def start_fake_upstream(fake: FakeUpstream) -> TestServer:
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    return server
