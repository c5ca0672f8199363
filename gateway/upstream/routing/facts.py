"""What the router reads from a request before choosing a backend: the model and the prompt's block chain.

JSON completions are parsed here (the pool sees only bytes, so every call site stays unchanged; one orjson parse
per miss, nothing on hits). The binary token path's body carries the exact token ids the model will see: those are
hashed instead of text (in blocks of `affinity_block_tokens`), which is what the backend's own prefix cache keys
on. Text chains and id chains live in different hash spaces, so a conversation that switches transport loses its
affinity once, never its correctness. Other paths (embeddings, relayed routes) carry a model at most.

The cost policy also reads the prompt's size in tokens (exact on the token path, characters / CHARS_PER_TOKEN on
text) and whether the answer streams (the first-byte deadline is a stream's); a `cache_salt` (which the gateway
sets from the tenant scope, `salt`) seeds the chain, so tenants never share a routed prefix.

Tokenizer calls (`LIGHT_PATHS`: the `tokens` key's `/tokenize` and `/apply-template`, the encoder's export) are
`light`: engines answer them beside their slots, without the model, so the pool routes them to the least loaded
engine and counts them in nothing the cost policy reads (load, queue, service time, share of requests, pile-up).
Counted as work, each miss's tokenize looked like a second request: in front of one-slot llama-servers it made a
busy engine look queued, spent the pile-up budget and taught the queue model a service time of a few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.upstream.routing.affinity import ids_chain, prompt_text, text_chain
from tokenedge_wire.framing import MAGIC, WireError, decode_request

PROMPT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/tokens/generate"})
MODEL_PATHS = PROMPT_PATHS | {"/v1/embeddings"}
LIGHT_PATHS = frozenset({"/tokenize", "/detokenize", "/apply-template", "/v1/tokenizer"})


CHARS_PER_TOKEN = 4  # a text prompt's size in tokens, as estimated for the cost policy


@dataclass(frozen=True, slots=True)
class Facts:
    model: str | None = None
    chain: tuple[int, ...] = ()
    prompt_tokens: int = 0
    block_tokens: float = 0.0  # prompt tokens per chain block
    stream: bool = False
    light: bool = False  # a tokenizer call: no slot, no model (LIGHT_PATHS)


NO_FACTS = Facts()
LIGHT_FACTS = Facts(light=True)


def facts_of(
    method: str, path_qs: str, body: bytes | None, *, block_chars: int, block_tokens: int, affinity: bool
) -> Facts:
    path = path_qs.partition("?")[0]
    if path in LIGHT_PATHS:
        return LIGHT_FACTS
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
    stream = doc.get("stream") is True
    if path not in PROMPT_PATHS:
        return Facts(model, stream=stream)
    text = prompt_text(doc) or ""
    salt = doc["cache_salt"] if isinstance(doc.get("cache_salt"), str) else ""
    chain = tuple(text_chain(text, block_chars, salt)) if affinity and text else ()
    return Facts(model, chain, len(text) // CHARS_PER_TOKEN, block_chars / CHARS_PER_TOKEN, stream)


def _binary_facts(body: bytes, block_tokens: int, affinity: bool) -> Facts:
    try:
        header, ids = decode_request(body)
    except WireError:
        return NO_FACTS
    params = header.get("params")
    params = params if isinstance(params, dict) else {}
    model = params.get("model") if isinstance(params.get("model"), str) else None
    salt = params["cache_salt"] if isinstance(params.get("cache_salt"), str) else ""
    chain = tuple(ids_chain(ids, block_tokens, salt)) if affinity else ()
    return Facts(model, chain, len(ids), float(block_tokens), params.get("stream") is True)
