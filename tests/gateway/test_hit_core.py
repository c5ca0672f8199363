"""The hit core as properties, on real sockets and real tiers (gateway/hits, gateway/edge/fastlane.py).

- No caller ever gets another caller's answer, whatever the tiers (L1, Redis, Redis Cluster, Memcached, L1 off)
  and however requests with the same bodies interleave on keep-alive connections, pipelined or not, with or
  without an ingress's per-request ids.
- Answers come back complete and in request order on a connection: hits, misses and `GET /health` mixed, sent
  whole or split anywhere (head/body, mid-head), with gaps, under concurrent load.
- A body trickled below the read timeout is answered 408 by `body_total_s` on every route, and counted.

The upstream here writes the caller's credential and the question into every answer, so a crossed or reordered
answer is visible in its bytes. Inputs are drawn from a seeded generator: a failure names its seed.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from harness.gateway import RunningGateway
from harness.services import MemcachedServer, serving
from tests.gateway.conftest import LOADED_UPSTREAM, GatewayFactory
from tests.support.cluster import LocalCluster

MODEL = "echo-model"
# TOKENEDGE_PROPERTY_SCALE=N runs N times the requests (the acceptance run of issue 26: N=16, ~20,000 pipelined).
SCALE = max(1, int(os.environ.get("TOKENEDGE_PROPERTY_SCALE", "1")))
CALLERS = 10
QUESTIONS = [f"question {i}: what is {i} + {i}?" for i in range(8)]


@dataclass
class CallerEcho:
    """An OpenAI-shaped upstream whose answer names who asked what (and counts completions)."""

    calls: int = 0
    serial: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "tokenedge": {"revision": "r1"}}]}
        )

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls += 1
        n = next(self.serial)
        asked = body["messages"][-1]["content"]
        return web.json_response(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 1700000000,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer_for(request.headers, asked)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
            }
        )


def answer_for(headers: Any, asked: str) -> str:
    return f"for {headers.get('Authorization', 'anonymous')} :: {asked}"


@pytest.fixture
async def echo_url() -> AsyncIterator[tuple[CallerEcho, str]]:
    echo = CallerEcho()
    async with serving(echo.app()) as url:
        yield echo, url


def body_of(question: str) -> bytes:
    return orjson.dumps(
        {"model": MODEL, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    )


def post(question: str, caller: int, *, ingress: bool, extra: str = "") -> bytes:
    body = body_of(question)
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        "Host: gateway.test",
        f"Authorization: Bearer caller-{caller}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if ingress:  # what every ingress, load balancer and CDN adds: unique per request
        lines += [
            f"X-Request-Id: {uuid.uuid4()}",
            f"traceparent: 00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
        ]
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


HEALTH = b"GET /health HTTP/1.1\r\nHost: gateway.test\r\n\r\n"


def lane_answers(gw: RunningGateway) -> float:
    metrics = gw.state.metrics
    metrics.tally.flush()
    return sum(metrics.lane_answers.labels(tier)._value.get() for tier in ("l1", "l2"))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def content(self) -> str:
        return str(orjson.loads(self.body)["choices"][0]["message"]["content"])


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Reply(int(lines[0].split(" ", 2)[1]), headers, body)


async def converse(port: int, batches: list[list[bytes]], splits: list[list[int]]) -> list[Reply]:
    """One keep-alive connection: each batch written pipelined (cut at `splits`, the loop yielding between
    pieces), then all its answers read before the next batch."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    replies: list[Reply] = []
    try:
        async with asyncio.timeout(120):  # a guard against a hang, not a measurement
            for batch, cuts in zip(batches, splits, strict=True):
                data = b"".join(batch)
                start = 0
                for cut in [*sorted(cuts), len(data)]:
                    writer.write(data[start:cut])
                    await writer.drain()
                    await asyncio.sleep(0)
                    start = cut
                for _ in batch:
                    replies.append(await read_reply(reader))
    finally:
        writer.close()
    return replies


TIER_SETS = ["l1", "redis+l1", "redis", "memcached", "cluster"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    running = LocalCluster(masters=3, replicas_per_master=0)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def cache_for(tiers: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if tiers == "l1":
        return {}
    if tiers in ("redis+l1", "redis"):
        cache: dict[str, Any] = {"redis_url": request.getfixturevalue("redis_url")}
    elif tiers == "memcached":
        server: MemcachedServer = request.getfixturevalue("memcached")
        cache = {"l2": "memcached", "memcached_servers": [server.server]}
    else:
        cluster: LocalCluster = request.getfixturevalue("cluster")
        for node in cluster.masters():
            client = node.client()
            client.flushall()
            client.close()
        cache = {"redis_url": cluster.url}
    if tiers != "redis+l1":
        cache["l1_max_bytes"] = 0  # every hit is an L2 read
    # A loaded 2-core machine runs this test: generous tier timeouts keep the tiers up (a degraded tier is
    # correct too, but then nothing would be read from it).
    cache["redis_timeout_s" if tiers != "memcached" else "memcached_timeout_s"] = 5.0
    return cache


@pytest.mark.parametrize("tiers", TIER_SETS)
async def test_no_caller_ever_gets_another_callers_answer(
    make_gateway: GatewayFactory,
    echo_url: tuple[CallerEcho, str],
    request: pytest.FixtureRequest,
    tiers: str,
) -> None:
    echo, url = echo_url
    gw = await make_gateway(url, cache=cache_for(tiers, request), upstream=LOADED_UPSTREAM)
    port = gw.server.port
    assert port is not None
    rng = random.Random(f"crossed-{tiers}")
    total, sent = 5000 * SCALE, 0
    plans: list[tuple[int, list[list[bytes]], list[list[str]]]] = []
    while sent < total:  # 2 connections a caller, batches of 1-4 pipelined requests
        caller = len(plans) % CALLERS
        batches, asked = [], []
        for _ in range(25):
            questions = [rng.choice(QUESTIONS) for _ in range(rng.randint(1, 4))]
            batches.append([post(q, caller, ingress=rng.random() < 0.5) for q in questions])
            asked.append(questions)
            sent += len(questions)
        plans.append((caller, batches, asked))
    results = await asyncio.gather(
        *(converse(port, batches, [[] for _ in batches]) for _, batches, _ in plans)
    )
    crossed = wrong = 0
    statuses: set[str] = set()
    for (caller, _, asked), replies in zip(plans, results, strict=True):
        expected = [q for batch in asked for q in batch]
        assert len(replies) == len(expected)
        for question, reply in zip(expected, replies, strict=True):
            assert reply.status == 200, reply.body
            statuses.add(reply.headers["cache-status"].split(";")[1].strip())
            content = reply.content()
            crossed += not content.startswith(f"for Bearer caller-{caller} ::")
            wrong += not content.endswith(f":: {question}")
    assert (crossed, wrong) == (0, 0)
    assert statuses == {"hit", "fwd=miss"}
    answered_fast = lane_answers(gw)
    assert 0 < answered_fast < total  # both lanes (and the fill) were exercised
    assert echo.calls <= CALLERS * len(QUESTIONS) * 2  # each (caller, question) filled about once


async def test_pipelined_hits_misses_and_health_answer_in_order_however_split(
    make_gateway: GatewayFactory, echo_url: tuple[CallerEcho, str]
) -> None:
    _, url = echo_url
    gw = await make_gateway(url, upstream=LOADED_UPSTREAM)
    port = gw.server.port
    assert port is not None
    for question in QUESTIONS:  # warm: these are hits from now on (for caller 0)
        await converse(port, [[post(question, 0, ingress=False)]], [[]])
    rng = random.Random("pipelining")
    fresh = itertools.count()

    def plan() -> tuple[list[list[bytes]], list[list[int]], list[str]]:
        batches, splits, expected = [], [], []
        for _ in range(20):
            batch = []
            for _ in range(rng.randint(2, 6)):
                kind = rng.random()
                if kind < 0.5:
                    question = rng.choice(QUESTIONS)  # a hit
                elif kind < 0.8:
                    question = f"new question {next(fresh)}"  # a miss, filled upstream
                else:
                    batch.append(HEALTH)
                    expected.append("health")
                    continue
                batch.append(post(question, 0, ingress=rng.random() < 0.5))
                expected.append(question)
            size = sum(map(len, batch))
            boundaries = list(itertools.accumulate(map(len, batch)))[:-1]  # whole requests, sent apart
            cuts = rng.sample(boundaries, k=rng.randint(0, len(boundaries)))
            cuts += rng.sample(range(1, size), k=rng.randint(0, 3))  # and anywhere: mid-head, head/body
            splits.append(sorted(set(cuts)))
            batches.append(batch)
        return batches, splits, expected

    plans = [plan() for _ in range(16 * SCALE)]
    results = await asyncio.gather(*(converse(port, b, s) for b, s, _ in plans))
    answered = 0
    for (_, _, expected), replies in zip(plans, results, strict=True):
        assert len(replies) == len(expected)
        for want, reply in zip(expected, replies, strict=True):
            assert reply.status == 200, reply.body
            if want == "health":
                assert orjson.loads(reply.body) == {"status": "ok"}
            else:
                assert reply.content() == f"for Bearer caller-0 :: {want}"
            answered += 1
    assert answered == sum(len(e) for _, _, e in plans) > 1000
    assert 0 < lane_answers(gw) < answered  # both lanes answered, interleaved on the same connections


@pytest.mark.parametrize("route", ["hit", "miss", "relay"])
async def test_a_trickled_body_is_answered_408_by_the_body_deadline_and_counted(
    make_gateway: GatewayFactory, echo_url: tuple[CallerEcho, str], route: str
) -> None:
    _, url = echo_url
    gw = await make_gateway(url, server={"body_read_timeout_s": 0.6, "body_total_s": 1.0})
    port = gw.server.port
    assert port is not None
    known = QUESTIONS[0]
    for _ in range(2):  # stored, then a hit: the fast lane knows these bytes
        await converse(port, [[post(known, 0, ingress=False)]], [[]])
    request = post(known if route == "hit" else "never asked", 0, ingress=True)
    if route == "relay":
        request = request.replace(b"/v1/chat/completions", b"/v1/moderations", 1)
    head, _, body = request.partition(b"\r\n\r\n")
    before = gw.state.metrics.slow_clients.labels("body")._value.get()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b"\r\n\r\n")
    sent = 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while not reader.at_eof() and sent < len(body):  # 1 byte every 0.1 s: each read well within 0.6 s
            writer.write(body[sent : sent + 1])
            sent += 1
            try:
                async with asyncio.timeout(0.1):
                    reply = await read_reply(reader)
                    break
            except TimeoutError:
                continue
        else:
            raise AssertionError("the whole body went in: no deadline fired")
    finally:
        writer.close()
    elapsed = loop.time() - started
    assert reply.status == 408 and orjson.loads(reply.body)["error"]["code"] == "request_timeout"
    assert elapsed < 1.0 + 1.0 and sent < len(body)
    assert gw.state.metrics.slow_clients.labels("body")._value.get() == before + 1
