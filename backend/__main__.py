"""`python -m backend` / `tokenedge-backend`: load the model, build the engine, serve the OpenAI API."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
from aiohttp import web

from backend.attention.selector import resolve_attention
from backend.config import BackendConfig
from backend.loader import LoadedModel, load_model
from backend.runtime import describe_runtime, log_runtime
from backend.server import ServedModel, ServerLimits, create_app
from backend.server.state import EngineFactory

log = logging.getLogger("tokenedge.backend")


def engine_factory(loaded: LoadedModel, config: BackendConfig, max_model_len: int) -> EngineFactory:
    from backend.engine.async_engine import AsyncEngine
    from backend.engine.config import EngineConfig
    from backend.model.llama import LlamaModel

    model = LlamaModel(loaded.config, dtype=config.torch_dtype, device=config.device)
    model.load_weights(loaded.weights)
    if config.weights == "quantized" and torch.device(config.device).type == "cpu":
        from backend.model.quant import quantize_model

        quantize_model(model, loaded.weights, loaded.quantized)
        log.info("weights: %d layers from 4-bit blocks, the rest int8", len(loaded.quantized))
    engine_config = EngineConfig(
        block_size=config.block_size,
        num_blocks=config.num_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        attention=config.attention,  # type: ignore[arg-type]
        device=config.device,
        max_waiting=config.max_waiting,
        batch_invariant=config.batch_invariant,
        # speculation is exact only on batch-invariant kernels (a k-token verify == k single steps)
        speculative_tokens=config.speculative_tokens if config.batch_invariant else 0,
    )
    eos_token_ids = loaded.tokenizer.eos_token_ids  # the closure must not keep the fp32 weights alive
    return lambda: AsyncEngine(model, engine_config, eos_token_ids)


def build_app(config: BackendConfig) -> web.Application:
    if config.threads:
        torch.set_num_threads(config.threads)
    loaded = load_model(config.model)
    max_model_len = min(config.max_model_len, loaded.config.max_position_embeddings)
    attention = resolve_attention(
        config.attention,  # type: ignore[arg-type]
        config.device,
        config.torch_dtype,
        config.block_size,
    )
    runtime = describe_runtime(config.device, config.torch_dtype, attention)
    log_runtime(runtime)
    served = ServedModel(
        id=config.served_model_name or loaded.name,
        revision=loaded.revision,
        tokenizer=loaded.tokenizer,
        max_model_len=max_model_len,
        created=int(time.time()),
        hidden_size=loaded.config.hidden_size,
        runtime=runtime,
        batch_invariant=config.batch_invariant,
    )
    limits = ServerLimits(
        max_n=config.max_n, default_max_tokens=config.default_max_tokens, retry_after_s=config.retry_after_s
    )
    return create_app(served, engine_factory(loaded, config, max_model_len), limits)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = BackendConfig.from_sources(argv)
    app = build_app(config)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its engine requests
    web.run_app(app, host=config.host, port=config.port, handler_cancellation=True)


if __name__ == "__main__":
    main()
