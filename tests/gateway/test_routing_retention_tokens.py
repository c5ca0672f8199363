"""Retention learnt over the binary token transport (gateway/upstream/routing/retention.py): two real backend apps
(the protocol, the ChatML byte tokenizer, the binary handler) over a scripted engine with an honest prefix cache over
ids, behind a cost pool. The usage frame's `cached_tokens` teaches each engine's retention, from a whole answer
(`request`) and from the frames as they stream (`open_stream`): an engine that keeps only its last prompt falls, one
that keeps every prefix stays at 1.

Mutation check, run by hand (the file copied first and restored from the copy): `Routed.iter_any` without its
`feed(chunk)` fails the streamed cases (the frames never pass the tap: retention stays at 1.0); without the
`reused` call in `UpstreamPool.request` the whole-answer cases fail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from backend.engine.outputs import TokenOut
from backend.engine.prompt import ValidPrompt
from backend.engine.sampling_params import SamplingParams
from gateway.config.upstream import BackendConfig, UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.routing.attempt import ROUTE_HEADER
from gateway.upstream.routing.build import build_upstream
from gateway.upstream.routing.pool import UpstreamPool
from gateway.upstream.routing.retention import ALPHA
from tests.support.token_backend import EchoEngine, backend_app, chatml_byte_tokenizer
from tokenedge_wire.framing import encode_request

TOKENIZER = chatml_byte_tokenizer()
PATH = "/v1/tokens/generate"


class CachingEngine(EchoEngine):
    """The scripted engine, reporting as cached the longest prefix it holds of each prompt: of every prompt it ran
    (`keep_all`: a paged prefix cache) or of its last one only (a single slot)."""

    def __init__(self, keep_all: bool) -> None:
        super().__init__(TOKENIZER)
        self.keep_all = keep_all

    async def generate(
        self, prompt: ValidPrompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[TokenOut]:
        ids = list(prompt.ids)
        held = self.prompts if self.keep_all else self.prompts[-1:]
        cached = max((_common(ids, p) for p in held), default=0)
        async for out in super().generate(prompt, params, request_id):
            yield dataclasses.replace(out, num_cached_tokens=cached)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture
async def fleet(request: pytest.FixtureRequest) -> AsyncIterator[tuple[UpstreamPool, bool]]:
    """A cost pool over two backend apps whose engines keep every prefix (`request.param`) or their last only."""
    servers = []
    for _ in range(2):
        server = TestServer(backend_app(TOKENIZER, CachingEngine(request.param), max_model_len=2048))
        await server.start_server()
        servers.append(server)
    urls = tuple(str(s.make_url("")).rstrip("/") for s in servers)
    backends = tuple(BackendConfig(u, prefill_tokens_per_s=1000.0) for u in urls)
    async with aiohttp.ClientSession() as session:
        built = build_upstream(
            UpstreamConfig(url=urls, backends=backends, health_path=""),
            session,
            RoutingMetrics(CollectorRegistry()),
        )
        assert isinstance(built, UpstreamPool)
        for b in built.backends:
            b.pace.reported = True  # the scripted engine answers at once: no fitted prefill rate
        yield built, request.param
    for server in servers:
        await server.close()


def payload(group: int, question: str, stream: bool) -> bytes:
    ids = TOKENIZER.encode(f"group {group}: " + "rule " * 100 + question)
    params: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "temperature": 0, "stream": stream}
    return encode_request({"endpoint": "completion", "tokenizer": TOKENIZER.version, "params": params}, ids)


async def send(pool: UpstreamPool, group: int, question: str, stream: bool) -> str:
    """The route header, once the whole answer (its frames) was read."""
    headers = {"Content-Type": "application/vnd.tokenedge.tokens"}
    if not stream:
        resp = await pool.request("POST", PATH, headers, payload(group, question, stream))
        assert resp.status == 200, resp.body
        return resp.headers[ROUTE_HEADER]
    async with pool.open_stream("POST", PATH, headers, payload(group, question, stream)) as streamed:
        assert streamed.status == 200
        async for _ in streamed.content.iter_any():
            pass
        return str(streamed.headers[ROUTE_HEADER])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fleet", [False, True], indirect=True, ids=["slot_only", "keeps_all"])
async def test_retention_is_learnt_from_the_binary_transports_usage_frame(
    fleet: tuple[UpstreamPool, bool], stream: bool
) -> None:
    """Four groups in turn, five rounds, one request at a time: each engine holds two groups and stays their home
    (cost, both idle). From the second round on the slot-only engines have just overwritten the group that comes
    next (8 answers each reuse only `group `); the keepers reuse everything, exactly as the router expected."""
    pool, keep_all = fleet
    for r in range(5):
        for g in range(4):
            await send(pool, g, f" question {r}", stream)
    assert [b.retention.samples for b in pool.backends] == [8, 8]
    route = dict(part.strip().split("=", 1) for part in (await send(pool, 0, " shown", stream)).split(";"))
    matched, expected = int(route["matched_tokens"]), int(route["expected_tokens"])
    assert matched >= 400
    if keep_all:
        assert [b.retention.value for b in pool.backends] == [1.0, 1.0] and expected == matched
    else:
        assert all(b.retention.value < (1 - ALPHA) ** 8 + 0.02 for b in pool.backends)
        assert expected < matched * ((1 - ALPHA) ** 8 + 0.02)
