"""The backend aiohttp application: routes, typed state, and the engine's lifetime as a cleanup_ctx.

`create_app` takes an engine *factory*, so the engine (and its compute thread) exists only between
startup and cleanup, and tests can serve a tiny model through the same code path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from backend.engine.grammar import GrammarCompiler
from backend.metrics import BackendMetrics
from backend.server import binary, completions, embeddings, ops, responses, revisions, tokenize
from backend.server.errors import error_middleware
from backend.server.response_store import ResponseStore
from backend.server.state import (
    ENGINE_FACTORY_KEY,
    ENGINE_KEY,
    GRAMMARS_KEY,
    LIMITS_KEY,
    METRICS_KEY,
    MODEL_KEY,
    RESPONSES_KEY,
    EngineFactory,
    ServedModel,
    ServerLimits,
)


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine = app[ENGINE_FACTORY_KEY]()
    await engine.start()
    app[ENGINE_KEY] = engine
    app[METRICS_KEY] = BackendMetrics(engine.stats)
    try:
        yield
    finally:
        await engine.stop()


def create_app(
    model: ServedModel, engine_factory: EngineFactory, limits: ServerLimits | None = None
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=8 * 1024 * 1024)
    app[MODEL_KEY] = model
    app[LIMITS_KEY] = limits or ServerLimits()
    app[ENGINE_FACTORY_KEY] = engine_factory
    app[RESPONSES_KEY] = ResponseStore(app[LIMITS_KEY].stored_responses)
    app[GRAMMARS_KEY] = GrammarCompiler(model.tokenizer, model.tokenizer.vocab_size)
    app.cleanup_ctx.append(_engine_ctx)
    app.router.add_post("/v1/chat/completions", completions.chat_completions)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_post("/v1/responses", responses.create_response)
    app.router.add_get("/v1/responses/{id}", responses.retrieve_response)
    app.router.add_delete("/v1/responses/{id}", responses.delete_response)
    app.router.add_post("/v1/embeddings", embeddings.embeddings)
    app.router.add_get("/v1/models", ops.list_models)
    app.router.add_get("/v1/models/{model:.+}", ops.retrieve_model)  # ids may hold '/' (org/name)
    app.router.add_get("/v1/tokenizer", ops.tokenizer)
    app.router.add_post("/tokenize", tokenize.tokenize)
    app.router.add_post("/detokenize", tokenize.detokenize)
    binary.register(app)  # POST /v1/tokens/generate: the binary token transport
    app.router.add_get("/health", ops.health)
    app.router.add_get("/metrics", ops.metrics)
    revisions.register(app, model.id, model.revision)  # X-Tokenedge-Revision and GET /tokenedge/revisions
    return app
