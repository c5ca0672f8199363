"""What each engine really keeps of its prefixes (gateway/upstream/routing/retention.py) and how the cost policy uses
it: the reuse an answer reports is found in JSON bodies, SSE streams cut anywhere and llama-server's timings, never
in generated text; the estimate follows honest fake engines on loopback, one that keeps only its last prompt
(llama-server with `--cache-ram 0`, one slot) and one that keeps every prefix (our backend, vLLM, llama-server's
prompt cache). With the first, the cost policy stops waiting for reuse that never happens and sends the request
where least-loaded does; with the second, nothing changes. Engines are held by gates and their arrivals awaited,
never slept on.

Mutation checks, run by hand (each file copied first and restored from the copy), each failing this file:
- `EngineView.expected_tokens` returning `self.matched_tokens` (retention ignored): the slot-only follower queues
  on the busy engine (test_the_cost_policy_stops_waiting_for_prefixes_a_slot_only_engine_dropped fails on "b"),
  and the slot-only route headers show the whole matched prefix as expected;
- `Retention.observe` returning False before it updates (never learnt): every retention test fails at 1.0;
- `UsageTap.feed` without the boundary check (`_split`): the split-stream test fails;
- `Routed.iter_any` without its `feed(chunk)` (a stream's rest never tapped; the fakes send the usage after the
  first chunk was read): the streamed cases fail;
- `UpstreamPool.request` never calling `reused`: the JSON cases and the follower test fail;
- `sample` comparing counts instead of shares (`reuse.cached / matched`): the unit test's engine that counted 400
  of 800 tokens against the router's estimate of 1000 fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.config.upstream import BackendConfig, UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER
from gateway.upstream.routing.build import build_upstream
from gateway.upstream.routing.cost import EngineView, cheapest
from gateway.upstream.routing.pool import UpstreamPool
from gateway.upstream.routing.retention import ALPHA, Retention, Reuse, UsageTap, reuse_of, sample
from tokenedge_wire.framing import frame

PATH = "/v1/chat/completions"
PREFIXES = [f"group {g}: " + "rule " * 800 for g in range(4)]  # about 1000 tokens each, nothing shared
TRICK = 'the log said "cached_tokens": 999 and "cache_n": 999'  # generated text spelling both markers
USAGE = {"prompt_tokens": 1000, "completion_tokens": 5, "total_tokens": 1005}


def sse(*docs: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


def delta(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def test_reuse_is_read_from_json_bodies_and_llama_timings_never_from_text() -> None:
    body = {"choices": [{"message": {"content": TRICK}}], "usage": {**USAGE, "prompt_tokens_details": None}}
    assert reuse_of(orjson.dumps(body)) is None  # vLLM without prompt token details: nothing said
    body["usage"] = {**USAGE, "prompt_tokens_details": {"cached_tokens": 640}}
    assert reuse_of(orjson.dumps(body)) == Reuse(640, 1000)
    llama = {"choices": [{"message": {"content": TRICK}}], "usage": USAGE, "timings": {"cache_n": 300}}
    llama["timings"]["prompt_n"] = 700
    assert reuse_of(orjson.dumps(llama)) == Reuse(300, 1000)  # prompt_n counts the computed ones only
    usage = {**USAGE, "prompt_tokens_details": {"cached_tokens": 16}}
    assert reuse_of(frame({"meta": {"id": "x"}}) + frame({"i": 0, "t": TRICK}) + frame({"usage": usage})) == (
        Reuse(16, 1000)
    )  # the binary transport's usage frame


def test_the_tap_reads_a_stream_cut_anywhere() -> None:
    """The usage chunk cut at every byte (a marker split across two chunks included), and the stream fed byte by
    byte: the same reuse. A stream that reports usage with every chunk gives its last."""
    usage = {**USAGE, "prompt_tokens_details": {"cached_tokens": 512}}
    stream = sse(delta(TRICK), delta("more"), {"choices": [], "usage": usage})
    for cut in range(1, len(stream)):
        tap = UsageTap()
        tap.feed(stream[:cut])
        tap.feed(stream[cut:])
        assert tap.reuse() == Reuse(512, 1000), cut
    tap = UsageTap()
    for i in range(len(stream)):
        tap.feed(stream[i : i + 1])
    assert tap.reuse() == Reuse(512, 1000)
    running = [
        {**delta(str(n)), "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": n}}} for n in (1, 2)
    ]
    tap = UsageTap()
    tap.feed(sse(*running))
    assert tap.reuse() == Reuse(2, 1000)
    tap = UsageTap()
    tap.feed(sse(delta(TRICK)))
    assert tap.reuse() is None


def test_a_sample_compares_shares_and_the_estimate_moves_by_alpha() -> None:
    assert sample(0, 1000, Reuse(500, 1000)) is None  # nothing expected: no evidence
    assert sample(500, 1000, Reuse(500, 1000)) == 1.0
    assert sample(500, 1000, Reuse(250, 1000)) == 0.5
    # a text prompt's tokens are estimated (characters / 4): the engine counted 800 tokens of the router's 1000
    assert sample(500, 1000, Reuse(400, 800)) == 1.0
    assert sample(500, 1000, Reuse(900, 1000)) == 1.0  # it reused more than expected: clamped
    assert sample(500, 1000, Reuse(100, None)) == pytest.approx(0.2)  # no prompt count: the counts
    r = Retention()
    assert not r.observe(0, 1000, Reuse(0, 1000)) and not r.observe(500, 1000, None) and r.value == 1.0
    for _ in range(5):
        assert r.observe(500, 1000, Reuse(0, 1000))
    assert r.value == pytest.approx((1 - ALPHA) ** 5) and r.samples == 5
    for _ in range(10):
        r.observe(500, 1000, Reuse(500, 1000))
    assert r.value > 0.9


def test_the_cost_policy_counts_the_matched_prefix_at_the_engines_retention() -> None:
    """Busy engine 0 holds the whole prompt and is free in 0.2 s: worth waiting for while it keeps its prefixes,
    not once it keeps a tenth of them (0.9 s of prefill left plus the wait, against 1 s on the idle engine)."""

    def engines(retention: float) -> list[EngineView]:
        return [
            EngineView(0, 1, 1, 0.2, 1000.0, 1000, retention=retention),
            EngineView(1, 0, 1, 0.0, 1000.0, 0),
        ]

    best, why = cheapest(engines(1.0), 1000)
    assert (best.engine.index, why.value, best.engine.expected_tokens) == (0, "prefix", 1000)
    best, why = cheapest(engines(0.1), 1000)
    assert (best.engine.index, why.value) == (1, "spill")
    best, why = cheapest([EngineView(0, 0, 1, 0.0, 1000.0, 1000, retention=0.0), engines(0)[1]], 1000)
    assert why.value == "balance"  # nothing is expected to be reused anywhere


@dataclass
class Fake:
    """An engine with an honest prefix cache over characters: `keep_all` remembers every prompt, else only its last
    (one slot). It reports cached characters of prompt characters as usage details, or only as llama-server's
    `timings`, in a JSON body or in an SSE stream's last chunk (written in two pieces cutting the marker)."""

    name: str
    keep_all: bool
    arrived: asyncio.Queue[str]
    report: str = "usage"
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    rest: asyncio.Event = field(default_factory=asyncio.Event)  # set once a stream's first chunk was read
    prompts: list[str] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self.gate.set()

    def _cached(self, prompt: str) -> int:
        held = self.prompts if self.keep_all else self.prompts[-1:]
        return max((len(_common(prompt, p)) for p in held), default=0)

    def _usage(self, prompt: str) -> dict[str, Any]:
        cached = self._cached(prompt)
        self.prompts.append(prompt)
        usage = {**USAGE, "prompt_tokens": len(prompt)}
        if self.report == "timings":
            return {"usage": usage, "timings": {"cache_n": cached, "prompt_n": len(prompt) - cached}}
        return {"usage": {**usage, "prompt_tokens_details": {"cached_tokens": cached}}}

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = "".join(f"{m['role']}\n{m['content']}\n" for m in body["messages"])
        self.arrived.put_nowait(self.name)
        await self.gate.wait()
        usage = self._usage(prompt)
        if not body.get("stream"):
            return web.json_response({"choices": [{"message": {"content": TRICK}}], **usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.rest.clear()
        await resp.write(b"data: " + orjson.dumps(delta(TRICK)) + b"\n\n")
        await self.rest.wait()  # the usage comes after the first chunk, in the stream's rest
        last = sse({"choices": [], **usage})
        cut = last.index(b"cache") + 3
        await resp.write(last[:cut])
        await resp.write(last[cut:])
        return resp


def _common(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


Fleet = tuple[UpstreamPool, list[Fake], RoutingMetrics]


@pytest.fixture
async def fleet(session: aiohttp.ClientSession, request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    """Two fakes (`keep_all` and `report` from the test's parameter) behind a cost pool, one slot each at 1000
    tokens/s, held as if the engines reported that rate themselves (they answer at once: a rate fitted to their
    first bytes would make prefill free); no health checks."""
    keep_all, report = request.param
    arrived: asyncio.Queue[str] = asyncio.Queue()
    fakes, servers = [Fake(n, keep_all, arrived, report) for n in ("a", "b")], []
    for f in fakes:
        app = web.Application()
        app.router.add_post(PATH, f.chat)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        f.url = str(server.make_url("")).rstrip("/")
        servers.append(server)
    backends = tuple(BackendConfig(f.url, name=f.name, prefill_tokens_per_s=1000.0) for f in fakes)
    config = UpstreamConfig(url=tuple(f.url for f in fakes), backends=backends, health_path="")
    metrics = RoutingMetrics(CollectorRegistry())
    pool = build_upstream(config, session, metrics)
    assert isinstance(pool, UpstreamPool)
    for b in pool.backends:
        b.pace.reported = True
    yield pool, fakes, metrics
    for f in fakes:
        f.gate.set()
    for server in servers:
        await server.close()


def body(group: int, question: str, stream: bool = False) -> bytes:
    messages = [{"role": "system", "content": PREFIXES[group]}, {"role": "user", "content": question}]
    return orjson.dumps({"model": "m", "stream": stream, "messages": messages})


async def ask(fleet: Fleet, group: int, question: str, stream: bool = False) -> tuple[str, str]:
    """The engine that answered and the route header, once the whole answer was read."""
    pool, fakes, _ = fleet
    if not stream:
        resp = await pool.request("POST", PATH, {}, body(group, question))
        return resp.headers[BACKEND_HEADER], resp.headers[ROUTE_HEADER]
    async with pool.open_stream("POST", PATH, {}, body(group, question, stream=True)) as streamed:
        async for _ in streamed.content.iter_any():
            for f in fakes:
                f.rest.set()
        return streamed.headers[BACKEND_HEADER], streamed.headers[ROUTE_HEADER]


async def rounds(fleet: Fleet, n: int, stream: bool = False) -> dict[int, set[str]]:
    """`n` rounds of the four groups in turn, one request at a time: each engine holds two groups, so one that keeps
    only its last prompt has always just overwritten the group that comes next. Group -> the engines it went to."""
    went: dict[int, set[str]] = {g: set() for g in range(len(PREFIXES))}
    for r in range(n):
        for g in went:
            went[g].add((await ask(fleet, g, f"question {r}", stream))[0])
    return went


def retention(fleet: Fleet) -> list[float]:
    """Each engine's retention, after checking that its gauge says the same."""
    pool, _, metrics = fleet
    registry = metrics.retention
    for b in pool.backends:
        assert registry.labels(b.url)._value.get() == pytest.approx(b.retention.value)
    return [b.retention.value for b in pool.backends]


def route_numbers(route: str) -> tuple[int, int]:
    fields = dict(part.strip().split("=", 1) for part in route.split(";"))
    return int(fields["matched_tokens"]), int(fields["expected_tokens"])


SLOT_ONLY, SLOT_TIMINGS, KEEPS_ALL = (False, "usage"), (False, "timings"), (True, "usage")


@pytest.mark.parametrize(
    ("fleet", "stream"),
    [(SLOT_ONLY, False), (SLOT_ONLY, True), (SLOT_TIMINGS, True), (KEEPS_ALL, False), (KEEPS_ALL, True)],
    indirect=["fleet"],
)
async def test_retention_is_learnt_from_json_answers_and_streams(fleet: Fleet, stream: bool) -> None:
    """Each group stays on its engine (both idle: the one that was sent it is cheapest). From the second round on
    (8 answers per engine), the slot-only engines reuse none of what they were expected to (the `group ` all
    prompts share is 0.2 % of it) and the estimate falls by a factor 1 - ALPHA per answer; the prefix keepers reuse
    it all and stay at 1, expecting what they were sent."""
    pool, fakes, _ = fleet
    went = await rounds(fleet, 5, stream)
    assert all(len(engines) == 1 for engines in went.values())
    assert [len(f.prompts) for f in fakes] == [10, 10]
    assert [b.retention.samples for b in pool.backends] == [8, 8]
    matched, expected = route_numbers((await ask(fleet, 0, "shown", stream))[1])
    assert matched > 900
    if fakes[0].keep_all:
        assert retention(fleet) == [1.0, 1.0] and expected == matched
    else:
        assert all(r < (1 - ALPHA) ** 8 + 0.01 for r in retention(fleet))
        assert expected < matched * ((1 - ALPHA) ** 8 + 0.01)


async def _follower(fleet: Fleet) -> tuple[str, str]:
    """Engine a was sent groups 0 and 2. Held busy answering group 2, where does the next request of group 0 go?"""
    a = fleet[1][0]
    while not a.arrived.empty():  # the arrivals of the rounds before
        a.arrived.get_nowait()
    a.gate.clear()
    held = asyncio.ensure_future(ask(fleet, 2, "held"))
    assert await asyncio.wait_for(a.arrived.get(), 10) == "a"
    follower = asyncio.ensure_future(ask(fleet, 0, "follower"))
    went = await asyncio.wait_for(a.arrived.get(), 10)
    a.gate.set()
    (engine, route), _ = await asyncio.gather(follower, held)
    assert engine == went
    return engine, route


@pytest.mark.parametrize(("fleet", "expected"), [(SLOT_ONLY, "b"), (KEEPS_ALL, "a")], indirect=["fleet"])
async def test_the_cost_policy_stops_waiting_for_prefixes_a_slot_only_engine_dropped(
    fleet: Fleet, expected: str
) -> None:
    """Trusting its record, the cost policy waits for busy a (the request ahead is expected to be short: a holds its
    prefix too) rather than prefill 1000 tokens on idle b. A slot-only a holds neither: with its retention learnt,
    both requests are expected to prefill most of their prompt there, so the follower goes to idle b, where
    least-loaded sends it. A prefix-keeping a is still waited for, as before."""
    await rounds(fleet, 5)
    engine, route = await _follower(fleet)
    assert engine == expected
    assert ("reason=spill" if expected == "b" else "reason=prefix") in route
