"""Lossless replay against the real `llama-server` (issue 35): a JSON hit after a plain stream is llama-server's own
JSON answer to the same request, field for field.

SmolLM2 at temperature 0 is deterministic, so llama-server's JSON answer, asked directly after the gateway recorded
its stream, is the answer the entry must reproduce. Documented exceptions (docs/request-flow.md): the hit's `id`
and `created` are the stream's (the answer that filled the entry), and so are llama.cpp's `timings` (measurements
of that run), and a member null or empty in one form may be absent in the other.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from bench.llama_server import LlamaServer
from tests.gateway.conftest import AUTH_A
from tests.gateway.test_llama_server import GREEDY, gw, llama
from tests.gateway.test_lossless import solid
from tests.support.gateway import RunningGateway

__all__ = ["gw", "llama"]  # the fixtures of tests/gateway/test_llama_server.py
RUN_MEASURES = ("id", "created", "timings")  # the fill's own, documented


async def post(url: str, body: dict[str, Any]) -> tuple[str, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body, headers=AUTH_A) as resp,
    ):
        assert resp.status == 200
        return resp.headers.get("Cache-Status", ""), await resp.read()


def without_run_measures(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in RUN_MEASURES}


async def test_a_json_hit_after_a_plain_stream_is_llama_servers_own_json(
    gw: RunningGateway, llama: LlamaServer
) -> None:
    _, streamed = await post(gw.url, {**GREEDY, "stream": True})
    chunks = [orjson.loads(line[6:]) for line in streamed.decode().split("\n") if line.startswith("data: {")]
    status, hit_raw = await post(gw.url, GREEDY)
    _, own_raw = await post(llama.url, GREEDY)  # llama-server's own JSON answer, asked directly
    hit, own = orjson.loads(hit_raw), orjson.loads(own_raw)

    assert status.startswith("tokenedge; hit;")
    assert (hit["id"], hit["created"]) == (chunks[0]["id"], chunks[0]["created"])  # the fill's identity
    assert solid(without_run_measures(hit)) == solid(without_run_measures(own))
    assert hit["choices"][0]["message"]["content"] and hit["usage"]["completion_tokens"] > 0
