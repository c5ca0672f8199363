"""vLLM-style `POST /tokenize` and `POST /detokenize`: the served tokenizer, without running the model.

`/tokenize` takes `prompt` (tokenized as /v1/completions does) or `messages` (rendered with the chat template and
a generation prompt unless `add_generation_prompt` is false, as /v1/chat/completions does), so a client can count
exactly what a request will cost; `/detokenize` turns ids back into text. Unknown fields are a 400 naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from backend.server.completions import model_not_found
from backend.server.errors import bad_request
from backend.server.protocol import parse_messages
from backend.server.state import MODEL_KEY, ServedModel
from backend.server.tools import render_messages
from backend.tokenizer import ChatTemplateError

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "add_generation_prompt"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


async def tokenize(request: web.Request) -> web.Response:
    model = request.app[MODEL_KEY]
    body = await _body(request, model, TOKENIZE_FIELDS)
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("give exactly one of 'prompt' and 'messages'", "prompt")
    tokenizer = model.tokenizer
    if "prompt" in body:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise bad_request("'prompt' must be a string", "prompt")
        ids = tokenizer.encode(prompt)
    else:
        generation = body.get("add_generation_prompt", True)
        if not isinstance(generation, bool):
            raise bad_request("'add_generation_prompt' must be a boolean", "add_generation_prompt")
        try:
            messages = render_messages(parse_messages(body["messages"]), None)  # as chat renders history
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation)
        except (ChatTemplateError, ValueError) as exc:
            raise bad_request(str(exc), "messages") from exc
        ids = tokenizer.encode(text)
    return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": model.max_model_len})


async def detokenize(request: web.Request) -> web.Response:
    model = request.app[MODEL_KEY]
    body = await _body(request, model, DETOKENIZE_FIELDS)
    ids = body.get("tokens")
    vocab = model.tokenizer.vocab_size
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
    ):
        raise bad_request(f"'tokens' must be an array of token ids in 0..{vocab - 1}", "tokens")
    try:
        text = model.tokenizer.decode(ids)
    except (KeyError, ValueError) as exc:
        raise bad_request(f"'tokens' holds an id with no text: {exc}", "tokens") from None
    return web.json_response({"prompt": text})


async def _body(request: web.Request, model: ServedModel, known: frozenset[str]) -> Mapping[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    for name in body:
        if name not in known:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    name = body.get("model")
    if name is not None and name != model.id:
        raise model_not_found(str(name))
    return body
