"""Read-only endpoints: `/v1/models`, `/v1/models/{id}`, `/v1/tokenizer`, `/health`, `/metrics`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from backend.metrics import CONTENT_TYPE
from backend.server import embeddings
from backend.server.completions import model_not_found
from backend.server.state import METRICS_KEY, MODEL_KEY, ServedModel

TRANSPORTS = ("json", "binary")  # binary: backend/server/binary.py


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_entry(request.app[MODEL_KEY])]})


async def retrieve_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}` (`client.models.retrieve`): the model object, or OpenAI's 404."""
    model, name = request.app[MODEL_KEY], request.match_info["model"]
    if name != model.id:
        raise model_not_found(name)
    return web.json_response(_model_entry(model))


def _model_entry(model: ServedModel) -> dict[str, Any]:
    return {
        "id": model.id,
        "object": "model",
        "created": model.created,
        "owned_by": "tokenedge",
        "tokenedge": {
            "revision": model.revision,
            "tokenizer": model.tokenizer.version,
            "max_model_len": model.max_model_len,
            "transports": list(TRANSPORTS),
            "embeddings": embeddings.describe(model),
            "runtime": dict(model.runtime),
            "batch_invariant": model.batch_invariant,
            # Seeded sampling repeats exactly when the logits are batch-invariant: each sequence samples its own row
            # with its own generator (backend/engine/sampling.py) and sampled rows never speculate. The gateway
            # caches `seed` + `temperature > 0` by default only where this is true (design §4).
            "seeded_invariant": model.batch_invariant,
        },
    }


async def tokenizer(request: web.Request) -> web.Response:
    export = request.app[MODEL_KEY].tokenizer.export()
    return web.json_response(export, headers={"ETag": f'"{export["version"]}"'})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
