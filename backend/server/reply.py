"""A request's choice events -> the OpenAI response: one JSON body, or SSE chunks as the events arrive.

Chat chunks open with a role delta per choice; completions with `echo` open with the prompt's text per choice.
Logprobs ride with the text they produced: each chunk carries the tokens behind its own text. With active tools
the answer is grammar-bound JSON (backend/server/tools.py) read as it forms (backend/server/tool_answer.py): a
stream sends each call's id and name once its name closes and its arguments as they are written (or the `response`
text as it decodes), and an answer cut short keeps the tool-call shape, its last call with partial arguments, under
the engine's finish reason (`length`); a whole call list finishes as `tool_calls`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from backend.engine.errors import EngineError
from backend.engine.logprobs import TokenLogprobs
from backend.server.errors import translate_engine_error
from backend.server.generation import ChoiceEvent, Usage
from backend.server.logprobs import LogprobRenderer
from backend.server.protocol import GenerationRequest
from backend.server.sse import open_stream, send_done, send_event
from backend.server.tool_answer import AnswerScanner, Progress, scan


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

    @property
    def tools(self) -> bool:
        return self.req.tools is not None and self.req.tools.active

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """A chat choice's message fields and finish reason: with tools, the answer becomes content or
        tool_calls (a whole call list: "tool_calls"; a cut one keeps its calls so far and the engine's reason)."""
        if not self.tools:
            return {"content": text}, finish
        return answer_fields(scan(text), finish)

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
        if reply.tools:
            await _stream_tool_answers(reply, chunk, first, events)
        else:
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


def answer_fields(answer: AnswerScanner, finish: str | None) -> tuple[dict[str, Any], str | None]:
    """A tool answer's message fields and finish reason, whole or cut."""
    reason = "tool_calls" if answer.complete and answer.kind == "calls" else finish
    if answer.kind == "calls" and answer.calls:
        return {"content": None, "tool_calls": [c.as_openai() for c in answer.calls]}, reason
    return {"content": answer.content}, reason


def progress_delta(answer: AnswerScanner, progress: Progress) -> dict[str, Any]:
    """One feed's news as a chat delta: a call opens with its id, type and name; then arguments pieces."""
    if not progress.calls:
        return {"content": progress.content}
    pieces = []
    for piece in progress.calls:
        if piece.opened:
            pieces.append({"index": piece.index, **answer.calls[piece.index].as_openai()})
            pieces[-1]["function"] = {**pieces[-1]["function"], "arguments": piece.arguments}
        else:
            pieces.append({"index": piece.index, "function": {"arguments": piece.arguments}})
    return {"tool_calls": pieces}


async def _stream_tool_answers(
    reply: Reply,
    chunk: Callable[[list[dict[str, Any]]], Awaitable[None]],
    first: ChoiceEvent,
    events: AsyncGenerator[ChoiceEvent, None],
) -> None:
    answers = [AnswerScanner() for _ in range(reply.num_choices)]
    tokens: list[list[TokenLogprobs]] = [[] for _ in range(reply.num_choices)]  # not yet sent
    event: ChoiceEvent | None = first
    while event is not None:
        i = event.index
        tokens[i].extend(event.logprobs)
        progress = answers[i].feed(event.text)
        if progress or (event.finish_reason is not None and tokens[i]):
            delta = progress_delta(answers[i], progress) if progress else {}
            logprobs = reply.logprobs(i, tokens[i])
            tokens[i] = []
            await chunk([{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": None}])
        if event.finish_reason is not None:
            _, finish = answer_fields(answers[i], event.finish_reason)
            await chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}])
        event = await anext(events, None)


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
        choices = []
        for i, text in enumerate(texts):
            fields, reason = reply.message(text, finish[i])
            message = {"role": "assistant", **fields}
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": reply.logprobs(i, tokens[i]),
                    "finish_reason": reason,
                }
            )
        obj = "chat.completion"
    else:
        choices = [
            {"index": i, "text": t, "logprobs": reply.logprobs(i, tokens[i]), "finish_reason": finish[i]}
            for i, t in enumerate(texts)
        ]
        obj = "text_completion"
    return web.json_response({**reply.meta, "object": obj, "choices": choices, "usage": usage.as_dict()})
