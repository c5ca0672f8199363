"""`POST /v1/tokens/generate`: the binary token transport (`application/vnd.tokenedge.tokens`).

The gateway has already tokenized the prompt with this model's own tokenizer (it checked the version), so the
body carries int32 ids instead of text; this handler validates them (vocabulary, lengths, framing: any bad
body is a 400, never a crash), runs the same choices as the JSON path and streams text events back as
length-prefixed JSON frames (tokenedge_wire/framing.py). The gateway renders the OpenAI body from them.
"""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import AsyncGenerator

from aiohttp import web

from backend.engine.errors import EngineError
from backend.engine.prompt import ValidPrompt
from backend.server.completions import (
    check_model,
    check_token_ids,
    choice_params,
    compile_grammar,
    response_meta,
)
from backend.server.errors import ApiError, bad_request, translate_engine_error
from backend.server.generation import Choice, ChoiceEvent, Usage, run_choices
from backend.server.prompts import valid_prompt
from backend.server.protocol import Endpoint, GenerationRequest, parse_request
from backend.server.state import ENGINE_KEY, GRAMMARS_KEY, LIMITS_KEY, METRICS_KEY, MODEL_KEY, ServedModel
from tokenedge_wire.framing import EVENTS_TYPE, REQUEST_TYPE, WireError, decode_request, frame
from tokenedge_wire.held_head import HeldHeadResponse

PATH = "/v1/tokens/generate"
ENDPOINTS = ("chat", "completion")


def register(app: web.Application) -> None:
    app.router.add_post(PATH, generate)


def check_ids(ids: array[int], model: ServedModel) -> ValidPrompt:
    """The prompt ids, once every one is a token of this model's vocabulary (not a placeholder for a byte
    the vocabulary has no token for) and the prompt fits the context."""
    return valid_prompt(ids, model, "prompt")


async def generate(request: web.Request) -> web.StreamResponse:
    app = request.app
    model, limits = app[MODEL_KEY], app[LIMITS_KEY]
    endpoint, req, prompt = await _parse(request, model, limits.max_n)
    grammar = compile_grammar(req, app[GRAMMARS_KEY])
    sampling = choice_params(req, len(prompt), model, limits, grammar)
    meta = response_meta(endpoint, model)
    usage = Usage()
    events = run_choices(
        app[ENGINE_KEY].generate,
        model.tokenizer,
        [Choice(prompt, p, counts_prompt=i == 0) for i, p in enumerate(sampling)],
        req.stop,
        meta["id"],
        usage,
        on_first_token=app[METRICS_KEY].ttft_seconds.observe,
    )
    async with contextlib.aclosing(events):
        try:
            first = await anext(events)
        except EngineError as exc:
            raise translate_engine_error(exc, limits.retry_after_s) from exc
        response = HeldHeadResponse(headers={"Content-Type": EVENTS_TYPE, "X-Accel-Buffering": "no"})
        await response.prepare(request)
        try:
            await _write_choices(response, req, frame({"meta": meta}), first, events)
            await response.write(frame({"usage": usage.as_dict()}))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the gateway went away: leaving closes `events`, which aborts the engine requests
        except EngineError as exc:
            error = translate_engine_error(exc, 1)
            with contextlib.suppress(ConnectionResetError):
                await response.write(frame({"error": error.body(), "status": error.status}))
        return response


async def _parse(
    request: web.Request, model: ServedModel, max_n: int
) -> tuple[Endpoint, GenerationRequest, ValidPrompt]:
    """The body as the endpoint, the sampling request and the prompt; any problem is a 4xx before the engine."""
    if request.content_type != REQUEST_TYPE:
        raise ApiError(415, f"the body must be {REQUEST_TYPE}", code="unsupported_media_type")
    try:
        header, ids = decode_request(await request.read())
    except WireError as exc:
        raise bad_request(str(exc)) from None
    endpoint, params = header.get("endpoint"), header.get("params")
    if endpoint not in ENDPOINTS or not isinstance(params, dict):
        raise bad_request("the header needs 'endpoint' (chat or completion) and a 'params' object")
    if header.get("tokenizer") != model.tokenizer.version:
        raise ApiError(
            409,
            f"these ids are for tokenizer {header.get('tokenizer')!r}, this model uses "
            f"{model.tokenizer.version!r}",
            code="tokenizer_mismatch",
        )
    # the sampling params under the JSON path's checks, with a stand-in for the prompt the ids carry
    stand_in = {"messages": [{"role": "user", "content": ""}]} if endpoint == "chat" else {"prompt": [0]}
    req = parse_request({**params, **stand_in}, endpoint, max_n)
    for param in ("logprobs", "echo", "tools"):  # outputs these frames cannot carry
        if getattr(req, param) not in (None, False):
            raise bad_request(f"'{param}' is not carried by the binary transport: use JSON", param)
    check_model(req, model)
    check_token_ids(req, model)
    return endpoint, req, check_ids(ids, model)


async def _write_choices(
    response: web.StreamResponse,
    req: GenerationRequest,
    opening: bytes,
    first: ChoiceEvent,
    events: AsyncGenerator[ChoiceEvent, None],
) -> None:
    """The choices' frames after `opening` (the meta frame), which goes out in the same write as the first."""
    event: ChoiceEvent | None = first
    if req.stream:  # one frame per event: the gateway's SSE chunks keep the JSON path's boundaries
        while event is not None:
            await response.write(
                opening + frame({"i": event.index, "t": event.text, "f": event.finish_reason})
            )
            opening = b""
            event = await anext(events, None)
        return
    texts: list[str] = [""] * req.n  # the gateway only needs each choice's whole text: one frame per choice
    finish: list[str | None] = [None] * req.n
    while event is not None:
        texts[event.index] += event.text
        finish[event.index] = event.finish_reason or finish[event.index]
        event = await anext(events, None)
    frames = (frame({"i": i, "t": t, "f": f}) for i, (t, f) in enumerate(zip(texts, finish, strict=True)))
    await response.write(b"".join([opening, *frames]))
