"""vLLM-style `POST /tokenize` and `POST /detokenize`: the served tokenizer, without running the model.

`/tokenize` takes `prompt` (tokenized as /v1/completions does; llama.cpp's name for it, `content`, too) or
`messages` (rendered with the chat template and a generation prompt unless `add_generation_prompt` is false, as
/v1/chat/completions does), so a client can count exactly what a request will cost; `/detokenize` turns ids back
into text. Unknown fields are a 400 naming them. The other engines' switches are taken as they mean them here:
vLLM's `add_special_tokens` and llama.cpp's `add_special` ask for the special tokens the model adds around a text,
and this engine adds none (a prompt runs as written; a chat template writes its own BOS), so either value gives the
ids the routes run; llama.cpp's `parse_special: false` reads special-token spellings as plain text, and its
`with_pieces: true` answers `[{id, piece}]`, the piece a string where the token's bytes are UTF-8, else a list of
byte values (as llama-server answers).
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
from backend.tokenizer import ChatTemplateError, Tokenizer

TOKENIZE_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "content",  # llama.cpp's name for the text
        "messages",
        "add_generation_prompt",
        "add_special_tokens",  # vLLM
        "add_special",  # llama.cpp
        "parse_special",  # llama.cpp
        "with_pieces",  # llama.cpp
    }
)
SWITCHES = ("add_generation_prompt", "add_special_tokens", "add_special", "parse_special", "with_pieces")
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


async def tokenize(request: web.Request) -> web.Response:
    model = request.app[MODEL_KEY]
    body = await _body(request, model, TOKENIZE_FIELDS)
    texts = [name for name in ("prompt", "content", "messages") if name in body]
    if len(texts) != 1:
        raise bad_request("give exactly one of 'prompt' (or 'content') and 'messages'", "prompt")
    for name in SWITCHES:
        if not isinstance(body.get(name, False), bool):
            raise bad_request(f"'{name}' must be a boolean", name)
    tokenizer = model.tokenizer
    special = body.get("parse_special", True)
    if texts[0] != "messages":
        prompt = body[texts[0]]
        if not isinstance(prompt, str):
            raise bad_request(f"'{texts[0]}' must be a string", texts[0])
        ids = tokenizer.encode(prompt, allow_special=special)
    else:
        try:
            messages = render_messages(parse_messages(body["messages"]), None)  # as chat renders history
            generation = body.get("add_generation_prompt", True)
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation)
        except (ChatTemplateError, ValueError) as exc:
            raise bad_request(str(exc), "messages") from exc
        ids = tokenizer.encode(text, allow_special=special)
    tokens: list[Any] = [_piece(tokenizer, i) for i in ids] if body.get("with_pieces") else ids
    return web.json_response({"tokens": tokens, "count": len(ids), "max_model_len": model.max_model_len})


def _piece(tokenizer: Tokenizer, token: int) -> dict[str, Any]:
    """llama-server's `with_pieces` entry: the token's text, or its bytes where they are not UTF-8 alone."""
    raw = tokenizer.decode_bytes([token])
    try:
        return {"id": token, "piece": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"id": token, "piece": list(raw)}


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
