"""`POST /v1/embeddings`: OpenAI's embeddings API over the engine's embedding sequences.

Pooling (llama.cpp's server is the reference for a decoder-only model): the vector is the **final-norm hidden
state of the last input token** (llama.cpp `--pooling last`, `LLAMA_POOLING_TYPE_LAST`, what decoder-only
embedding GGUFs such as Qwen3-Embedding declare), **L2-normalized** the way llama-server does by default
(`embd_normalize = 2`: the sum of squares in double, one fp32 scale). llama.cpp takes the pooling from the GGUF's
`pooling_type` key; SmolLM2's GGUF has none, and under causal attention the last token is the one position that
sees the whole input, so `last` is the choice (mean pooling would need every position's state and cannot reuse a
cached prefix). Inputs are tokenized like a completions prompt, so an embedding and a completion of the same text
see the same ids. Every input of a request is its own prefill-only sequence in the engine, batched with whatever
else is running; `dimensions` is accepted only when it equals the model's width (nothing is truncated).
"""

from __future__ import annotations

import asyncio
import base64
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from aiohttp import web

from backend.engine.embedding import POOLING, EmbeddingOut
from backend.engine.errors import EngineError
from backend.engine.prompt import ValidPrompt
from backend.server.completions import model_not_found
from backend.server.errors import bad_request, translate_engine_error
from backend.server.prompts import valid_prompt
from backend.server.state import ENGINE_KEY, LIMITS_KEY, MODEL_KEY, Engine, ServedModel

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
WINDOW = 32  # inputs of one request in the engine at once: a long list cannot fill the waiting queue alone
EncodingFormat = Literal["float", "base64"]


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str | None
    inputs: tuple[str | tuple[int, ...], ...]  # texts, or token-id arrays
    encoding_format: EncodingFormat
    dimensions: int | None


def parse_embedding_request(body: Any) -> EmbeddingRequest:
    """Validate an OpenAI embeddings body; any bad shape is a 400 naming the field."""
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    fmt: EncodingFormat
    match body.get("encoding_format"):
        case None | "float":
            fmt = "float"
        case "base64":
            fmt = "base64"
        case other:
            raise bad_request(
                f"'encoding_format' must be 'float' or 'base64', got {other!r}",
                "encoding_format",
                code="invalid_value",
            )
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
    ):
        raise bad_request("'dimensions' must be a positive integer", "dimensions", code="invalid_type")
    return EmbeddingRequest(model, _inputs(body.get("input")), fmt, dimensions)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    expected = "a non-empty string, an array of them, an array of token ids, or an array of such arrays"
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_token(t) for t in value):
        items = [value]  # one input given as token ids
    elif isinstance(value, list) and value:
        items = value
    else:
        raise bad_request(f"'input' must be {expected}", "input")
    if len(items) > MAX_INPUTS:
        raise bad_request(f"'input' holds {len(items)} inputs; at most {MAX_INPUTS} per request", "input")
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(items):
        if isinstance(item, str) and item:
            out.append(item)
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            out.append(tuple(item))
        else:
            raise bad_request(
                f"input[{i}] must be a non-empty string or a non-empty array of token ids", "input"
            )
    return tuple(out)


def input_prompts(req: EmbeddingRequest, model: ServedModel) -> list[ValidPrompt]:
    """Every input as a prompt: texts tokenized like a completions prompt, id arrays taken as they are."""
    tokenizer = model.tokenizer
    return [
        valid_prompt(tokenizer.encode(item) if isinstance(item, str) else item, model, "input", f"input[{i}]")
        for i, item in enumerate(req.inputs)
    ]


def check_dimensions(req: EmbeddingRequest, model: ServedModel) -> None:
    """`dimensions` shortens OpenAI's text-embedding-3 vectors; this model's cannot be: only its width passes."""
    if req.dimensions is not None and req.dimensions != model.hidden_size:
        width = (
            f"its embeddings have {model.hidden_size} dimensions" if model.hidden_size else "unknown width"
        )
        raise bad_request(
            f"this model does not support 'dimensions' = {req.dimensions} ({width})",
            "dimensions",
            code="unsupported_value",
        )


def normalize(vector: torch.Tensor) -> torch.Tensor:
    """llama.cpp's `common_embd_normalize(..., 2)`: Euclidean norm summed in double, one fp32 scale, 0 for 0."""
    # vector: [hidden] fp32
    norm = math.sqrt(float(vector.double().square().sum()))
    return vector * (1.0 / norm if norm > 0.0 else 0.0)


def encode(vector: torch.Tensor, fmt: EncodingFormat) -> list[float] | str:
    """`float`: a JSON array; `base64`: the little-endian float32 bytes, as OpenAI's clients decode them."""
    if fmt == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def embed_all(engine: Engine, prompts: Sequence[ValidPrompt], request_id: str) -> list[EmbeddingOut]:
    """Every input as its own engine request, at most WINDOW at once; the first failure cancels the rest
    (cancelling a task aborts its engine request)."""
    gate = asyncio.Semaphore(WINDOW)

    async def one(index: int, prompt: ValidPrompt) -> EmbeddingOut:
        async with gate:
            return await engine.embed(prompt, f"{request_id}-{index}")

    tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(prompts)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def embeddings(request: web.Request) -> web.Response:
    app = request.app
    model = app[MODEL_KEY]
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    req = parse_embedding_request(body)
    if req.model is not None and req.model != model.id:
        raise model_not_found(req.model)
    check_dimensions(req, model)
    prompts = input_prompts(req, model)
    try:
        results = await embed_all(app[ENGINE_KEY], prompts, f"embd-{uuid.uuid4().hex}")
    except EngineError as exc:
        raise translate_engine_error(exc, app[LIMITS_KEY].retry_after_s) from exc
    data = [
        {"object": "embedding", "index": i, "embedding": encode(normalize(out.vector), req.encoding_format)}
        for i, out in enumerate(results)
    ]
    num_tokens = sum(len(p) for p in prompts)
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": model.id,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }
    )


def describe(model: ServedModel) -> dict[str, Any]:
    """What /v1/models reports about embeddings under `tokenedge.embeddings`."""
    return {"pooling": POOLING, "normalization": "l2", "dimensions": model.hidden_size}
