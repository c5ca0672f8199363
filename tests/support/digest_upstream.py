"""An OpenAI-compatible upstream whose every answer is a digest of everything it received (a test oracle).

The digest covers the method, the path, the raw query string, every header but the few listed below, and the body
as the model would read it. It is this test's own statement of what reaches the model, written without the
gateway's code, so a gateway that merges two requests this upstream answers differently is caught:
- headers left out: what any HTTP client or proxy sets for itself (`FRAMING`: host, length, encoding, connection)
  and what upstreams are known to log but never answer by (`IGNORED`: request ids, trace context, user agents, SDK
  telemetry such as `X-Stainless-*`). Every other header counts, by name, each name's values in order.
- the body: parsed as JSON; the fields this upstream does not read are left out (`UNREAD`: the answer's form, and
  bookkeeping the endpoint does not echo), and order counts except where JSON objects are order-free to any engine:
  the request's top level, each message object's and content part's own keys, `logit_bias` and `metadata`.
  Everywhere else (tools, schemas, unknown nested values) key order is part of the digest, as engines render and
  generate in the order given.
Answers: chat content, completion text, Responses output text are the hex digest; an embedding is the digest's
16 bytes as numbers. Chat streams send the digest in two content chunks, then usage, then `[DONE]`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

FRAMING = frozenset(
    {"host", "content-length", "accept-encoding", "connection", "keep-alive", "transfer-encoding"}
)
IGNORED = frozenset({"user-agent", "x-request-id", "traceparent", "tracestate", "baggage"})
IGNORED_PREFIXES = ("x-stainless-",)
_FORM = {"stream", "stream_options"}
UNREAD: Mapping[str, frozenset[str]] = {
    "chat/completions": frozenset(
        _FORM | {"user", "safety_identifier", "prompt_cache_key", "metadata", "store", "cache_salt"}
    ),
    "completions": frozenset(_FORM | {"user", "cache_salt"}),
    "embeddings": frozenset({"user"}),
    "responses": frozenset(_FORM | {"store"}),
}
ORDER_FREE = ("logit_bias", "metadata")
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def model_view(endpoint: str, body: Mapping[str, Any]) -> Any:
    """The body as the model reads it (see the module docstring)."""
    out: dict[str, Any] = {}
    for name in sorted(body):
        if name in UNREAD[endpoint]:
            continue
        value = body[name]
        if name in ORDER_FREE and isinstance(value, dict):
            value = dict(sorted(value.items()))
        elif name == "messages" and isinstance(value, list):
            value = [_message(m) for m in value]
        out[name] = value
    return out


def _message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    out = {name: message[name] for name in sorted(message)}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [dict(sorted(p.items())) if isinstance(p, dict) else p for p in content]
    return out


def digest_of(method: str, path: str, query: str, headers: Any, endpoint: str, body: bytes) -> str:
    fields = [
        (name.lower(), value)
        for name, value in headers.items()
        if name.lower() not in FRAMING
        and name.lower() not in IGNORED
        and not name.lower().startswith(IGNORED_PREFIXES)
    ]
    fields.sort(key=lambda f: f[0])  # stable: a name's values stay in order
    material = orjson.dumps([method, path, query, fields, model_view(endpoint, orjson.loads(body))])
    return hashlib.blake2b(material, digest_size=16).hexdigest()


class DigestUpstream:
    def __init__(self, revision: str = "rev-1") -> None:
        self.revision = revision
        self.calls = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        for endpoint in UNREAD:
            app.router.add_post(f"/v1/{endpoint}", self._answer(endpoint))
        return app

    async def models(self, _request: web.Request) -> web.Response:
        model = {"id": "test-model", "object": "model", "tokenedge": {"revision": self.revision}}
        return web.json_response({"object": "list", "data": [model]})

    def _answer(self, endpoint: str) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            self.calls += 1
            raw = await request.read()
            body = orjson.loads(raw)
            digest = digest_of(
                request.method, request.path, request.rel_url.raw_query_string, request.headers, endpoint, raw
            )
            if endpoint == "chat/completions" and body.get("stream") is True:
                return await _chat_stream(request, body, digest)
            return web.Response(
                body=orjson.dumps(_json(endpoint, body, digest)), content_type="application/json"
            )

        return handler


def _json(endpoint: str, body: Mapping[str, Any], digest: str) -> dict[str, Any]:
    model = body.get("model")
    match endpoint:
        case "chat/completions":
            message = {"role": "assistant", "content": digest}
            choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
            out = {"id": "chatcmpl-d", "object": "chat.completion", "created": 1, "model": model}
            out |= {"choices": [choice], "usage": USAGE}
            if "service_tier" in body:  # echoed, as OpenAI does
                out["service_tier"] = body["service_tier"]
            return out
        case "completions":
            choice = {"index": 0, "text": digest, "finish_reason": "stop", "logprobs": None}
            return {"id": "cmpl-d", "object": "text_completion", "created": 1, "model": model,
                    "choices": [choice], "usage": USAGE}  # fmt: skip
        case "embeddings":
            vector = [float(b) for b in bytes.fromhex(digest)]
            data = [{"object": "embedding", "index": 0, "embedding": vector}]
            usage = {"prompt_tokens": 3, "total_tokens": 3}
            return {"object": "list", "data": data, "model": model, "usage": usage}
        case _:
            text = {"type": "output_text", "text": digest, "annotations": []}
            item = {
                "type": "message",
                "id": "msg-d",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
            out = {"id": "resp-d", "object": "response", "created_at": 1, "status": "completed", "model": model,
                   "output": [item], "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}}  # fmt: skip
            for echoed in ("metadata", "user", "safety_identifier", "prompt_cache_key", "service_tier"):
                if echoed in body:
                    out[echoed] = body[echoed]
            return out


async def _chat_stream(request: web.Request, body: Mapping[str, Any], digest: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    base = {"id": "chatcmpl-d", "object": "chat.completion.chunk", "created": 1, "model": body.get("model")}
    pieces = [{"role": "assistant", "content": digest[:10]}, {"content": digest[10:]}]
    for i, delta in enumerate(pieces):
        finish = "stop" if i == len(pieces) - 1 else None
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write(b"data: " + orjson.dumps({**base, "choices": [], "usage": USAGE}) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def start_digest_upstream(upstream: DigestUpstream) -> TestServer:
    server = TestServer(upstream.app(), host="127.0.0.1")
    await server.start_server()
    return server
