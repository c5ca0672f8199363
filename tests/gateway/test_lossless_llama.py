"""Lossless replay against the real `llama-server` (issue 35): a JSON hit after a plain stream is llama-server's own
JSON answer to the same request, field for field.

SmolLM2 at temperature 0 is deterministic, so llama-server's JSON answer, asked directly after the gateway recorded
its stream, is the answer the entry must reproduce. Documented exceptions (docs/request-flow.md): the hit's `id`
and `created` are the stream's (the answer that filled the entry), and so are the measurements of that run
(llama.cpp's `timings`, and `usage.prompt_tokens_details.cached_tokens`: the prompt tokens llama-server found in
its prompt cache that time), and a member null or empty in one form may be absent in the other.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from harness.gateway import RunningGateway
from harness.peers.llama_server import LlamaServer
from tests.gateway.conftest import AUTH_A
from tests.gateway.test_llama_server import GREEDY, gw, llama
from tests.gateway.test_lossless import solid
from tests.gateway.test_stream import stored

__all__ = ["gw", "llama"]  # the fixtures of tests/gateway/test_llama_server.py
RUN_MEASURES = ("id", "created", "timings")  # the fill's own, documented


async def post(url: str, body: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body, headers=AUTH_A) as resp,
    ):
        assert resp.status == 200
        return dict(resp.headers), await resp.read()


def without_run_measures(doc: dict[str, Any]) -> dict[str, Any]:
    """The answer less what describes the run that made it (documented): the identity, the timings, and how much
    of the prompt llama-server found in its prompt cache that time (`usage.prompt_tokens_details.cached_tokens`)."""
    usage = {
        **doc["usage"],
        "prompt_tokens_details": {**doc["usage"]["prompt_tokens_details"], "cached_tokens": 0},
    }
    return {**{k: v for k, v in doc.items() if k not in RUN_MEASURES}, "usage": usage}


async def test_a_json_hit_after_a_plain_stream_is_llama_servers_own_json(
    gw: RunningGateway, llama: LlamaServer
) -> None:
    filled, _ = await post(gw.url, {**GREEDY, "stream": True})
    entry = await stored(gw, filled["X-Cache-Key"])
    assert entry is not None and entry.stream_chunks is not None
    recorded = [orjson.loads(chunk) for chunk in entry.stream_chunks]
    headers, hit_raw = await post(gw.url, GREEDY)
    _, own_raw = await post(llama.url, GREEDY)  # llama-server's own JSON answer, asked directly
    hit, own = orjson.loads(hit_raw), orjson.loads(own_raw)

    assert headers["Cache-Status"].startswith("tokenedge; hit;")
    # the fill's identity: llama.cpp stamps each chunk, and `created` is the last chunk's (forms' scalar rule)
    assert (hit["id"], hit["created"]) == (recorded[0]["id"], recorded[-1]["created"])
    assert solid(without_run_measures(hit)) == solid(without_run_measures(own))
    assert hit["choices"][0]["message"]["content"] and hit["usage"]["completion_tokens"] > 0
