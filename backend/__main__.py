"""`python -m backend` / `tokenedge-backend`: load the model, build the engine, serve the OpenAI API."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import torch
from aiohttp import web

from backend.attention.selector import resolve_attention
from backend.config import BackendConfig
from backend.engine.config import EngineConfig
from backend.loader import LoadedModel, load_model
from backend.loader.revision import served_revision
from backend.runtime import describe_runtime, log_runtime
from backend.server import ServedModel, ServerLimits, create_app
from backend.server.response_store import StoreLimits
from backend.server.state import EngineFactory

log = logging.getLogger("tokenedge.backend")


def engine_factory(loaded: LoadedModel, config: BackendConfig, engine_config: EngineConfig) -> EngineFactory:
    from backend.engine.async_engine import AsyncEngine
    from backend.model.llama import LlamaModel
    from backend.model.tiling_store import TilingStore

    model = LlamaModel(loaded.config, dtype=config.torch_dtype, device=engine_config.device)
    model.load_weights(loaded.weights)
    if config.weights == "quantized" and torch.device(engine_config.device).type == "cpu":
        from backend.model.quant import quantize_model

        quantize_model(model, loaded.weights, loaded.quantized)
        log.info("weights: %d layers from 4-bit blocks, the rest int8", len(loaded.quantized))
    eos_token_ids = loaded.tokenizer.eos_token_ids  # the closure must not keep the fp32 weights alive
    # the store's context reads the thread count: built when the engine starts, after build_app set it
    return lambda: AsyncEngine(model, engine_config, eos_token_ids, TilingStore.default(model.device))


def numerics(config: BackendConfig, device: str) -> str:
    """How the served model computes beyond its file and config: answers differ in their last bits between any
    two of these, so it is folded into the served revision (`served_revision`) and shown in the runtime."""
    dev = torch.device(device)
    if config.weights == "quantized" and dev.type == "cpu":
        from backend.kernels.load import kernel_id

        return f"{dev.type} {config.dtype} quantized int4-{kernel_id()}"
    return f"{dev.type} {config.dtype} dequantized"


def build_app(config: BackendConfig) -> web.Application:
    if config.threads:
        torch.set_num_threads(config.threads)
    loaded = load_model(config.model)
    if (
        loaded.tokenizer.vocab_size > loaded.config.vocab_size
    ):  # the server checks prompts against the tokenizer
        raise ValueError(
            f"the tokenizer has {loaded.tokenizer.vocab_size} tokens, the model only {loaded.config.vocab_size}"
        )
    # the configured context, capped by what the model was trained for
    engine = dataclasses.replace(
        config.engine, max_model_len=min(config.engine.max_model_len, loaded.config.max_position_embeddings)
    )
    attention = resolve_attention(
        engine.attention,
        engine.device,
        config.torch_dtype,
        engine.block_size,
        batch_invariant=engine.batch_invariant,
    )
    runtime = describe_runtime(engine.device, config.torch_dtype, attention)
    runtime["numerics"] = numerics(config, engine.device)
    log_runtime(runtime)
    served = ServedModel(
        id=config.served_model_name or loaded.name,
        revision=served_revision(loaded.revision, runtime["numerics"]),
        tokenizer=loaded.tokenizer,
        max_model_len=engine.max_model_len,
        created=int(time.time()),
        hidden_size=loaded.config.hidden_size,
        runtime=runtime,
        batch_invariant=engine.batch_invariant,
    )
    limits = ServerLimits(
        max_n=config.max_n,
        default_max_tokens=config.default_max_tokens,
        retry_after_s=config.retry_after_s,
        stored_responses=StoreLimits(config.max_stored_responses, config.max_stored_response_bytes),
    )
    return create_app(served, engine_factory(loaded, config, engine), limits)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = BackendConfig.from_sources(argv)
    app = build_app(config)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its engine requests
    web.run_app(app, host=config.host, port=config.port, handler_cancellation=True)


if __name__ == "__main__":
    main()
