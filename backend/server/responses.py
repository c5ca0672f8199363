"""`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: a Responses request runs on the chat path.

The body becomes a chat request (backend/server/response_items.py): input items, `instructions`, function
tools and `tool_choice` (grammar-bound, backend/server/tools.py), `text.format`, sampling. The answer is one
Response object or its event stream (backend/server/response_stream.py). `store` (default true, as OpenAI's)
keeps the Response and its conversation in a bounded LRU (backend/server/response_store.py), which
`previous_response_id` continues and `GET`/`DELETE` read and remove; only a cleanly finished Response is kept.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from aiohttp import web

from backend.engine.errors import EngineError
from backend.server.completions import check_model, choice_params, compile_grammar, prompts_of
from backend.server.errors import ApiError, bad_request, translate_engine_error
from backend.server.generation import Choice, ChoiceEvent, Usage, run_choices
from backend.server.protocol import parse_request
from backend.server.response_items import chat_body, parse_body
from backend.server.response_object import collect_text, finished, response_head
from backend.server.response_store import ResponseStore
from backend.server.response_stream import stream_response
from backend.server.state import ENGINE_KEY, GRAMMARS_KEY, LIMITS_KEY, METRICS_KEY, MODEL_KEY, RESPONSES_KEY


async def create_response(request: web.Request) -> web.StreamResponse:
    app = request.app
    model, limits, store = app[MODEL_KEY], app[LIMITS_KEY], app[RESPONSES_KEY]
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    req = parse_body(body)
    history = _history(store, req.previous_response_id)
    chat = parse_request(chat_body(req, history), "chat", 1)
    check_model(chat, model)
    prompt = prompts_of(chat, model)[0]
    params = choice_params(chat, len(prompt), model, limits, compile_grammar(chat, app[GRAMMARS_KEY]))
    tools = chat.tools is not None and chat.tools.active
    usage = Usage()
    events = run_choices(
        app[ENGINE_KEY].generate,
        model.tokenizer,
        [Choice(prompt, params[0], counts_prompt=True)],
        (),
        f"resp-{uuid.uuid4().hex}",
        usage,
        on_first_token=app[METRICS_KEY].ttft_seconds.observe,
    )
    head = response_head(req, model.id)
    response: web.StreamResponse
    async with contextlib.aclosing(events):
        try:
            first: ChoiceEvent = await anext(events)
        except EngineError as exc:
            raise translate_engine_error(exc, limits.retry_after_s) from exc
        if req.stream:
            response, final = await stream_response(request, head, first, events, usage, tools)
        else:
            text, finish = await collect_text(first, events)
            final = finished(head, text, finish, usage, tools)
            response = web.json_response(final)
    if final is not None and req.store:
        store.put(final, [*history, *req.items, *final["output"]])
    return response


def _history(store: ResponseStore, previous: str | None) -> tuple[dict[str, Any], ...]:
    """The stored conversation `previous_response_id` continues: its input items, then its output."""
    if previous is None:
        return ()
    entry = store.get(previous)
    if entry is None:
        raise not_found(previous, "previous_response_id")
    return entry.conversation


async def retrieve_response(request: web.Request) -> web.Response:
    response_id = request.match_info["id"]
    entry = request.app[RESPONSES_KEY].get(response_id)
    if entry is None:
        raise not_found(response_id)
    return web.json_response(entry.response)


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["id"]
    if not request.app[RESPONSES_KEY].delete(response_id):
        raise not_found(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})  # OpenAI's shape


def not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", param=param)
