"""End to end with SmolLM2 as `make run` starts it (scripts/run.sh): the real `openai` client embeds a string, a list
and a base64 request through the gateway (the second call of each is a cache hit with the same vectors), and
retrieves the model from the backend and through the gateway; the backend reports its runtime under `tokenedge`."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
from openai import AsyncOpenAI

from tests.support.make_run import start_run_script, wait_ready

MODEL = "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.slow


async def embed_twice(client: AsyncOpenAI, **kwargs: Any) -> list[list[float]]:
    """Two identical calls through the gateway: a stored miss, then a hit with the same vectors."""
    statuses, vectors = [], []
    for _ in range(2):
        raw = await client.embeddings.with_raw_response.create(model=MODEL, **kwargs)
        statuses.append(raw.headers["Cache-Status"])
        vectors.append([d.embedding for d in raw.parse().data])
    assert statuses[0].startswith("tokenedge; fwd=miss; stored"), statuses
    assert statuses[1].startswith("tokenedge; hit"), statuses
    assert np.array_equal(np.float32(vectors[0]), np.float32(vectors[1]))
    for vector in vectors[0]:
        assert len(vector) == 576 and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4
    return vectors[0]


async def test_smollm2_embeddings_and_models_through_make_run() -> None:
    proc, backend_port, gateway_port = await start_run_script(stdout=asyncio.subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, f"http://127.0.0.1:{backend_port}/health", proc)
            await wait_ready(session, f"http://127.0.0.1:{gateway_port}/health", proc)
        gateway = AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key="e2e-key", max_retries=0
        )
        backend = AsyncOpenAI(base_url=f"http://127.0.0.1:{backend_port}/v1", api_key="unused", max_retries=0)
        async with gateway, backend:
            (one,) = await embed_twice(
                gateway, input="The capital of France is Paris.", encoding_format="float"
            )
            listed = await embed_twice(
                gateway,
                input=["Paris is in France.", "The capital of France is Paris."],
                encoding_format="float",
            )
            (packed,) = await embed_twice(
                gateway, input="The capital of France is Paris."
            )  # the client's base64
            assert np.allclose(listed[1], one, atol=1e-5) and np.array_equal(
                np.float32(packed), np.float32(one)
            )
            assert not np.allclose(listed[0], one, atol=1e-2)

            model = await backend.models.retrieve(MODEL)
            extra = model.model_extra or {}
            runtime = extra["tokenedge"]["runtime"]
            assert runtime["device"] == "cpu" and runtime["dtype"] == "bfloat16" and runtime["threads"] >= 1
            assert runtime["attention"] == "sdpa" and runtime["matmul"] and runtime["cpu"]["capability"]
            assert extra["tokenedge"]["embeddings"] == {
                "pooling": "last",
                "normalization": "l2",
                "dimensions": 576,
            }
            assert (await gateway.models.retrieve(MODEL)).id == MODEL
            with pytest.raises(openai.NotFoundError):
                await backend.models.retrieve("gpt-9")
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
