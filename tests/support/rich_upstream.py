"""An upstream that answers with every field real engines send, in both forms, written out by hand.

For the lossless tests (tests/gateway/test_lossless.py): the JSON answer and the stream of one request are two
independent, hand-written documents, consistent the way a real engine's are (the stream's pieces make the JSON's
text), so an entry filled by one form and served in the other can be compared with the upstream's own answer in
that form. Every OpenAI chat and completions field is there (`refusal`, `annotations`, `audio`, the legacy
`function_call`, `tool_calls`, `logprobs`, `system_fingerprint`, `service_tier`, `usage` details) with the
extensions of vLLM (`stop_reason`, `prompt_logprobs`, `kv_transfer_params`, `token_ids`), SGLang (`matched_stop`),
llama.cpp (`reasoning_content`, `timings`) and two fields no engine sends (`x_vendor`, `x_meta`). `split_object`
streams an object of unknown merge rule in two pieces, which no rule can turn into JSON.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

USAGE = {
    "prompt_tokens": 12,
    "completion_tokens": 9,
    "total_tokens": 21,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 4, "audio_tokens": 0},
}
TIMINGS = {"prompt_n": 12, "prompt_ms": 1.5, "predicted_n": 9, "predicted_ms": 3.25}
ANNOTATION = {
    "type": "url_citation",
    "url_citation": {"url": "https://example.org/", "title": "Example", "start_index": 0, "end_index": 5},
}
TOKENS = [
    {"token": "Hello", "logprob": -0.25, "bytes": [72, 101, 108, 108, 111], "top_logprobs": []},
    {
        "token": ", world",
        "logprob": -0.5,
        "bytes": None,
        "top_logprobs": [{"token": ", world", "logprob": -0.5}],
    },
]
WEATHER = '{"city": "Paris"}'


def chat_json(n: int, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1700000000 + n,
        "model": model,
        "system_fingerprint": "fp_rich",
        "service_tier": "default",
        "prompt_logprobs": None,
        "kv_transfer_params": None,
        "x_vendor": {"trace": "t-1", "region": "eu"},
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hello, world",
                    "reasoning_content": "Think: greet.",
                    "refusal": None,
                    "annotations": [ANNOTATION],
                    "audio": {
                        "id": "audio_1",
                        "data": "QUJDRA==",
                        "transcript": "Hello",
                        "expires_at": 1700003600,
                    },
                    "function_call": {"name": "legacy", "arguments": '{"a": 1}'},
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": WEATHER},
                        },
                        {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
                    ],
                    "x_meta": {"k": [1, 2]},
                },
                "logprobs": {"content": TOKENS, "refusal": None},
                "finish_reason": "tool_calls",
                "stop_reason": 42,
                "matched_stop": 2,
            }
        ],
        "usage": USAGE,
        "timings": TIMINGS,
    }


def chat_stream(n: int, model: str, *, usage: bool, split_object: bool) -> list[dict[str, Any]]:
    base = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion.chunk",
        "created": 1700000000 + n,
        "model": model,
        "system_fingerprint": "fp_rich",
        "service_tier": "default",
        "x_vendor": {"trace": "t-1", "region": "eu"},
    }

    def chunk(delta: dict[str, Any], logprobs: Any = None, **choice: Any) -> dict[str, Any]:
        fields = {"logprobs": logprobs, "finish_reason": None, "stop_reason": None, **choice}
        return {**base, "choices": [{"index": 0, "delta": delta, **fields}]}

    x_meta = [{"x_meta": {"k": [1]}}, {"x_meta": {"j": [2]}}] if split_object else [{"x_meta": {"k": [1, 2]}}]
    chunks = [
        chunk({"role": "assistant", "content": "", "refusal": None}),
        chunk({"reasoning_content": "Think: "}),
        chunk({"reasoning_content": "greet."}),
        chunk({"content": "Hello"}, {"content": TOKENS[:1], "refusal": None}),
        chunk({"content": ", world"}, {"content": TOKENS[1:], "refusal": None}),
        chunk({"annotations": [ANNOTATION]}),
        chunk({"audio": {"id": "audio_1", "transcript": "Hel"}}),
        chunk({"audio": {"data": "QUJD", "transcript": "lo"}}),
        chunk({"audio": {"data": "RA==", "expires_at": 1700003600}}),
        chunk({"function_call": {"name": "legacy", "arguments": ""}}),
        chunk({"function_call": {"arguments": '{"a": 1}'}}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather"}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": WEATHER[:9]}}]}),
        chunk(
            {"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "time"}}]}
        ),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": WEATHER[9:]}}]}),
        *(chunk(delta) for delta in x_meta),
        chunk({}, finish_reason="tool_calls", stop_reason=42, matched_stop=2),
    ]
    chunks[-1]["timings"] = TIMINGS  # llama.cpp: the closing chunk carries the timings
    if usage:
        chunks.append({**base, "choices": [], "usage": USAGE})
    return chunks


def text_json(n: int, model: str) -> dict[str, Any]:
    return {
        "id": f"cmpl-{n}",
        "object": "text_completion",
        "created": 1700000000 + n,
        "model": model,
        "system_fingerprint": "fp_rich",
        "choices": [
            {
                "index": 0,
                "text": " four.",
                "logprobs": {
                    "tokens": [" four", "."],
                    "token_logprobs": [-0.125, -0.5],
                    "top_logprobs": [{" four": -0.125}, {".": -0.5}],
                    "text_offset": [0, 5],
                },
                "finish_reason": "stop",
                "stop_reason": None,
                "prompt_logprobs": None,
                "token_ids": [3, 4],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "timings": TIMINGS,
    }


def text_stream(n: int, model: str, *, usage: bool) -> list[dict[str, Any]]:
    base = {
        "id": f"cmpl-{n}",
        "object": "text_completion",
        "created": 1700000000 + n,
        "model": model,
        "system_fingerprint": "fp_rich",
    }

    def piece(text: str, k: int) -> dict[str, Any]:
        logprobs = {
            "tokens": [text],
            "token_logprobs": [[-0.125, -0.5][k]],
            "top_logprobs": [{text: [-0.125, -0.5][k]}],
            "text_offset": [[0, 5][k]],
        }
        fields = {"logprobs": logprobs, "finish_reason": None, "stop_reason": None, "token_ids": [3 + k]}
        return {**base, "choices": [{"index": 0, "text": text, **fields}]}

    closing = {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop", "stop_reason": None}
    chunks = [piece(" four", 0), piece(".", 1), {**base, "choices": [closing], "timings": TIMINGS}]
    if usage:
        chunks.append(
            {**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
        )
    return chunks


@dataclass
class RichUpstream:
    split_object: bool = False  # stream `x_meta` in two pieces: an object no rule merges
    calls: int = 0
    serial: itertools.count = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        return app

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": "rich", "object": "model", "owned_by": "test", "tokenedge": {"revision": "rev-1"}}
        return web.json_response({"object": "list", "data": [model]})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls += 1
        n, chat = next(self.serial), request.path.endswith("chat/completions")
        if not body.get("stream"):
            return web.json_response(chat_json(n, body["model"]) if chat else text_json(n, body["model"]))
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        chunks = (
            chat_stream(n, body["model"], usage=usage, split_object=self.split_object)
            if chat
            else text_stream(n, body["model"], usage=usage)
        )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
