"""A request's choice events -> the OpenAI response: one JSON body, or SSE chunks as the events arrive.

Chat chunks open with a role delta per choice; completions with `echo` open with the prompt's text per choice.
Logprobs ride with the text they produced: each chunk carries the tokens behind its own text.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from backend.engine.errors import EngineError
from backend.engine.outputs import TokenLogprobs
from backend.server.errors import translate_engine_error
from backend.server.generation import ChoiceEvent, Usage
from backend.server.logprobs import LogprobRenderer
from backend.server.protocol import GenerationRequest
from backend.server.sse import open_stream, send_done, send_event


@dataclass(slots=True)
class Reply:
    """How one request's choices are rendered; keeps each choice's text offset for completions' logprobs."""

    req: GenerationRequest
    meta: dict[str, Any]
    renderer: LogprobRenderer
    echoes: Sequence[str]  # per choice: the text before the completion ("" without echo)
    offsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.offsets = [len(e) for e in self.echoes]

    @property
    def chat(self) -> bool:
        return self.req.endpoint == "chat"

    @property
    def num_choices(self) -> int:
        return len(self.echoes)

    def logprobs(self, index: int, tokens: Sequence[TokenLogprobs]) -> dict[str, Any] | None:
        if self.req.logprobs is None:
            return None
        if self.chat:
            return self.renderer.chat(tokens)
        body, self.offsets[index] = self.renderer.completion(tokens, self.offsets[index])
        return body

    def delta(self, event: ChoiceEvent) -> dict[str, Any]:
        logprobs = self.logprobs(event.index, event.logprobs)
        if self.chat:
            delta = {"content": event.text} if event.text else {}
            return {
                "index": event.index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": event.finish_reason,
            }
        return {
            "index": event.index,
            "text": event.text,
            "logprobs": logprobs,
            "finish_reason": event.finish_reason,
        }


async def stream_reply(
    request: web.Request,
    reply: Reply,
    first: ChoiceEvent,
    events: AsyncGenerator[ChoiceEvent, None],
    usage: Usage,
) -> web.StreamResponse:
    req, meta = reply.req, reply.meta
    obj = "chat.completion.chunk" if reply.chat else "text_completion"
    response = await open_stream(request)
    extra = {"usage": None} if req.include_usage else {}

    async def chunk(choices: list[dict[str, Any]]) -> None:
        await send_event(response, {**meta, "object": obj, "choices": choices, **extra})

    try:
        if reply.chat:
            opening = {"role": "assistant", "content": ""}
            await chunk(
                [
                    {"index": i, "delta": opening, "logprobs": None, "finish_reason": None}
                    for i in range(reply.num_choices)
                ]
            )
        elif req.echo:
            await chunk(
                [
                    {"index": i, "text": text, "logprobs": None, "finish_reason": None}
                    for i, text in enumerate(reply.echoes)
                ]
            )
        event: ChoiceEvent | None = first
        while event is not None:
            if event.text or event.finish_reason or event.logprobs:
                await chunk([reply.delta(event)])
            event = await anext(events, None)
        if req.include_usage:
            await send_event(response, {**meta, "object": obj, "choices": [], "usage": usage.as_dict()})
        await send_done(response)
    except ConnectionResetError:
        pass  # the client went away: leaving here closes `events`, which aborts the engine requests
    except EngineError as exc:
        error = translate_engine_error(exc, 1)
        with contextlib.suppress(ConnectionResetError):
            await send_event(response, error.body())
    return response


async def collect_reply(
    reply: Reply, first: ChoiceEvent, events: AsyncGenerator[ChoiceEvent, None], usage: Usage
) -> web.Response:
    count = reply.num_choices
    texts = list(reply.echoes)
    tokens: list[list[TokenLogprobs]] = [[] for _ in range(count)]
    finish: list[str | None] = [None] * count
    event: ChoiceEvent | None = first
    while event is not None:
        texts[event.index] += event.text
        tokens[event.index].extend(event.logprobs)
        finish[event.index] = event.finish_reason or finish[event.index]
        event = await anext(events, None)
    if reply.chat:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": t},
                "logprobs": reply.logprobs(i, tokens[i]),
                "finish_reason": finish[i],
            }
            for i, t in enumerate(texts)
        ]
        obj = "chat.completion"
    else:
        choices = [
            {"index": i, "text": t, "logprobs": reply.logprobs(i, tokens[i]), "finish_reason": finish[i]}
            for i, t in enumerate(texts)
        ]
        obj = "text_completion"
    return web.json_response({**reply.meta, "object": obj, "choices": choices, "usage": usage.as_dict()})
