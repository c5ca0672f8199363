"""Read-only endpoints: `/v1/models`, `/v1/tokenizer`, `/health`, `/metrics`."""

from __future__ import annotations

from aiohttp import web

from backend.metrics import CONTENT_TYPE
from backend.server.state import METRICS_KEY, MODEL_KEY

TRANSPORTS = ("json", "binary")  # binary: backend/server/binary.py


async def list_models(request: web.Request) -> web.Response:
    model = request.app[MODEL_KEY]
    entry = {
        "id": model.id,
        "object": "model",
        "created": model.created,
        "owned_by": "tokenedge",
        "tokenedge": {
            "revision": model.revision,
            "tokenizer": model.tokenizer.version,
            "max_model_len": model.max_model_len,
            "transports": list(TRANSPORTS),
            "batch_invariant": model.batch_invariant,
        },
    }
    return web.json_response({"object": "list", "data": [entry]})


async def tokenizer(request: web.Request) -> web.Response:
    export = request.app[MODEL_KEY].tokenizer.export()
    return web.json_response(export, headers={"ETag": f'"{export["version"]}"'})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
