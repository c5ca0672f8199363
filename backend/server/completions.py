"""`POST /v1/chat/completions` and `POST /v1/completions`: parse, tokenize, validate the prompt once
(backend/server/prompts.py), run the choices, and answer as one JSON body or as an SSE stream. The first event
is awaited before a stream is opened, so errors that happen at admission (a full queue) still get their status
code."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from backend.engine.errors import EngineError
from backend.engine.prompt import ValidPrompt
from backend.engine.sampling_params import SamplingParams
from backend.server.errors import ApiError, bad_request, translate_engine_error
from backend.server.generation import ChoiceEvent, Usage, run_choices
from backend.server.prompts import valid_prompt
from backend.server.protocol import Endpoint, GenerationRequest, parse_request
from backend.server.sse import open_stream, send_done, send_event
from backend.server.state import ENGINE_KEY, LIMITS_KEY, METRICS_KEY, MODEL_KEY, ServedModel, ServerLimits
from backend.tokenizer import ChatTemplateError


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "completion")


async def _serve(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    app = request.app
    model, limits = app[MODEL_KEY], app[LIMITS_KEY]
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    req = parse_request(body, endpoint, limits.max_n)
    check_model(req, model)
    prompt = _prompt(req, model)
    params = choice_params(req, len(prompt), model, limits)
    meta = response_meta(endpoint, model)
    request_id = meta["id"]
    usage = Usage()
    metrics = app[METRICS_KEY]
    events = run_choices(
        app[ENGINE_KEY].generate,
        model.tokenizer,
        prompt,
        params,
        req.stop,
        request_id,
        usage,
        on_first_token=metrics.ttft_seconds.observe,
    )
    async with contextlib.aclosing(events):
        try:
            first = await anext(events)
        except EngineError as exc:
            raise translate_engine_error(exc, limits.retry_after_s) from exc
        if req.stream:
            return await _stream(request, req, meta, first, events, usage)
        return await _collect(req, meta, first, events, usage)


def _prompt(req: GenerationRequest, model: ServedModel) -> ValidPrompt:
    tokenizer = model.tokenizer
    if req.endpoint == "chat":
        try:
            text = tokenizer.apply_chat_template(list(req.messages), add_generation_prompt=True)
        except (ChatTemplateError, ValueError) as exc:
            raise bad_request(str(exc), "messages") from exc
        return valid_prompt(tokenizer.encode(text), model, "messages")
    assert req.prompt is not None
    ids = tokenizer.encode(req.prompt) if isinstance(req.prompt, str) else req.prompt
    return valid_prompt(ids, model, "prompt")


def check_model(req: GenerationRequest, model: ServedModel) -> None:
    """404 `model_not_found` unless the request names this model or none."""
    if req.model is not None and req.model != model.id:
        raise model_not_found(req.model)


def model_not_found(name: str) -> ApiError:
    return ApiError(
        404,
        f"the model '{name}' does not exist",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def response_meta(endpoint: Endpoint, model: ServedModel) -> dict[str, Any]:
    """The fields every response object and chunk of one request shares, with a fresh id."""
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model.id,
        "system_fingerprint": model.revision,
    }


def choice_params(
    req: GenerationRequest, prompt_len: int, model: ServedModel, limits: ServerLimits
) -> list[SamplingParams]:
    """One SamplingParams per choice (choice i seeded `seed + i`); 400 if max_tokens overflows the context."""
    room = model.max_model_len - prompt_len
    max_tokens = min(limits.default_max_tokens, room) if req.max_tokens is None else req.max_tokens
    if max_tokens > room:
        raise bad_request(
            f"max_tokens {max_tokens} plus the prompt's {prompt_len} tokens exceeds the maximum context "
            f"length {model.max_model_len}",
            "max_tokens",
            code="context_length_exceeded",
        )
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=None if req.seed is None else req.seed + i,
        )
        for i in range(req.n)
    ]


def _choice_delta(req: GenerationRequest, event: ChoiceEvent, text: str) -> dict[str, Any]:
    if req.endpoint == "chat":
        delta = {"content": text} if text else {}
        return {"index": event.index, "delta": delta, "logprobs": None, "finish_reason": event.finish_reason}
    return {"index": event.index, "text": text, "logprobs": None, "finish_reason": event.finish_reason}


async def _stream(
    request: web.Request,
    req: GenerationRequest,
    meta: dict[str, Any],
    first: ChoiceEvent,
    events: AsyncGenerator[ChoiceEvent, None],
    usage: Usage,
) -> web.StreamResponse:
    obj = "chat.completion.chunk" if req.endpoint == "chat" else "text_completion"
    response = await open_stream(request)
    extra = {"usage": None} if req.include_usage else {}

    async def chunk(choices: list[dict[str, Any]]) -> None:
        await send_event(response, {**meta, "object": obj, "choices": choices, **extra})

    try:
        if req.endpoint == "chat":
            await chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(req.n)
                ]
            )
        event: ChoiceEvent | None = first
        while event is not None:
            if event.text or event.finish_reason:
                await chunk([_choice_delta(req, event, event.text)])
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


async def _collect(
    req: GenerationRequest,
    meta: dict[str, Any],
    first: ChoiceEvent,
    events: AsyncGenerator[ChoiceEvent, None],
    usage: Usage,
) -> web.Response:
    texts = [""] * req.n
    finish: list[str | None] = [None] * req.n
    event: ChoiceEvent | None = first
    while event is not None:
        texts[event.index] += event.text
        finish[event.index] = event.finish_reason or finish[event.index]
        event = await anext(events, None)
    if req.endpoint == "chat":
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": t},
                "logprobs": None,
                "finish_reason": finish[i],
            }
            for i, t in enumerate(texts)
        ]
        obj = "chat.completion"
    else:
        choices = [
            {"index": i, "text": t, "logprobs": None, "finish_reason": finish[i]} for i, t in enumerate(texts)
        ]
        obj = "text_completion"
    return web.json_response({**meta, "object": obj, "choices": choices, "usage": usage.as_dict()})
