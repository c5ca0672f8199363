"""What the router reads from a request before choosing a backend: the model and the prompt's block chain.

JSON completions are parsed here (the pool sees only bytes, so every call site stays unchanged; one orjson parse
per miss, nothing on hits). The binary token path's body carries the exact token ids the model will see: those are
hashed instead of text (in blocks of `affinity_block_tokens`), which is what the backend's own prefix cache keys
on. Text chains and id chains live in different hash spaces, so a conversation that switches transport loses its
affinity once, never its correctness. Other paths (embeddings, relayed routes) carry a model at most.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.upstream.routing.affinity import ids_chain, prompt_text, text_chain
from tokenedge_wire.framing import MAGIC, WireError, decode_request

PROMPT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/tokens/generate"})
MODEL_PATHS = PROMPT_PATHS | {"/v1/embeddings"}


@dataclass(frozen=True, slots=True)
class Facts:
    model: str | None = None
    chain: tuple[int, ...] = ()


NO_FACTS = Facts()


def facts_of(
    method: str, path_qs: str, body: bytes | None, *, block_chars: int, block_tokens: int, affinity: bool
) -> Facts:
    path = path_qs.partition("?")[0]
    if method != "POST" or not body or path not in MODEL_PATHS:
        return NO_FACTS
    if body.startswith(MAGIC):
        return _binary_facts(body, block_tokens, affinity)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return NO_FACTS
    if not isinstance(doc, dict):
        return NO_FACTS
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    if not affinity or path not in PROMPT_PATHS:
        return Facts(model)
    text = prompt_text(doc)
    return Facts(model, tuple(text_chain(text, block_chars)) if text else ())


def _binary_facts(body: bytes, block_tokens: int, affinity: bool) -> Facts:
    try:
        header, ids = decode_request(body)
    except WireError:
        return NO_FACTS
    params = header.get("params")
    model = params.get("model") if isinstance(params, dict) else None
    model = model if isinstance(model, str) else None
    return Facts(model, tuple(ids_chain(ids, block_tokens)) if affinity else ())
