"""The closed request model as a property (design §2.1): whenever the gateway answers a request from an entry, the
entry is the answer the upstream gives to this request asked directly.

The upstream is `tests.support.digest_upstream`: it answers with a digest of everything it received (method, path,
query, every header but a short list written in that module, the body as the model reads it). Each example takes a
base request, sends it (so it is stored), then neighbours of it, each differing in one part: a query parameter,
a credential-looking header, an ordinary header, an ignored header, key order at some depth, a known or unknown
field, the form (stream or not), the lane (the ordinary path, or raw bytes the fast lane may answer). A neighbour
the gateway merges with the base must get the base's digest from the upstream too. Run with L1 only and with Redis.
Each mutation check breaks one rule of the request table on purpose and shows the property then fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway.keys.parts import Part
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from tests.support.digest_upstream import DigestUpstream, start_digest_upstream
from tests.support.rawhttp import ask_kept_alive

NO_AUTO = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")  # send exactly the headers a test names


@dataclass(frozen=True)
class Req:
    endpoint: str
    body: dict[str, Any]
    order: tuple[str, ...] = ()  # top-level field order (empty: as built)
    query: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = (
        ("Authorization", "Bearer a"),
        ("Content-Type", "application/json"),
    )
    raw: bool = False  # raw bytes on a socket (the fast lane may answer), else an HTTP client

    def body_bytes(self) -> bytes:
        names = [n for n in self.order if n in self.body] + [n for n in self.body if n not in self.order]
        return orjson.dumps({name: self.body[name] for name in names})

    def path(self) -> str:
        qs = "&".join(f"{k}={v}" for k, v in self.query)
        return f"/v1/{self.endpoint}" + (f"?{qs}" if qs else "")


def _schema(first: str) -> dict[str, Any]:
    props = {"name": {"type": "string"}, "country": {"type": "string"}}
    ordered = dict(sorted(props.items(), key=lambda p: p[0] != first))
    return {"type": "object", "properties": ordered, "required": list(ordered)}


BASES: dict[str, list[dict[str, Any]]] = {
    "chat/completions": [
        {"model": "test-model", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": "test-model",
            "temperature": 0,
            "messages": [{"role": "user", "content": "who?"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": _schema("name")}}],
        },
        {
            "model": "test-model",
            "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a person"}]}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": _schema("name")},
            },
        },
    ],
    "completions": [{"model": "test-model", "temperature": 0, "prompt": "Once", "max_tokens": 4}],
    "embeddings": [{"model": "test-model", "input": "hello"}],
    "responses": [
        {"model": "test-model", "temperature": 0, "store": False, "input": "hi", "metadata": {"a": "1"}}
    ],
}


def _set_header(req: Req, name: str, value: str) -> Req:
    kept = tuple((n, v) for n, v in req.headers if n.lower() != name.lower())
    return replace(req, headers=(*kept, (name, value)))


def _set_query(req: Req, name: str, value: str) -> Req:
    return replace(req, query=(*(p for p in req.query if p[0] != name), (name, value)))


def _set_field(req: Req, name: str, value: Any) -> Req:
    return replace(req, body={**req.body, name: value})


def _swap_schema(req: Req) -> Req:
    """The schema's (or the tool's parameters') properties in the other order."""
    body = orjson.loads(orjson.dumps(req.body))
    for schema in _schemas(body):
        schema["properties"] = dict(reversed(list(schema["properties"].items())))
    return replace(req, body=body)


def _schemas(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for tool in body.get("tools", []):
        yield tool["function"]["parameters"]
    if "response_format" in body:
        yield body["response_format"]["json_schema"]["schema"]


def _reorder_messages(req: Req) -> Req:
    messages = [dict(reversed(list(m.items()))) for m in req.body.get("messages", [])]
    return _set_field(req, "messages", messages) if messages else req


Change = Callable[[Req], Req]
CREDENTIAL_NAMES = (
    "x-goog-api-key",
    "Ocp-Apim-Subscription-Key",
    "apikey",
    "Cookie",
    "X-Auth-Token",
    "Authorization",
)
IGNORED = ("X-Request-Id", "User-Agent", "X-Stainless-Lang", "traceparent")


def changes() -> st.SearchStrategy[Change]:
    """One part of a request changed (values from small sets, so neighbours collide with stored entries)."""
    value = st.sampled_from(["a", "b"])
    return st.one_of(
        st.builds(
            lambda k, v: lambda r: _set_query(r, k, v),
            st.sampled_from(["api-version", "key", "api-key", "subscription-key", "x"]),
            value,
        ),
        st.builds(lambda k, v: lambda r: _set_header(r, k, v), st.sampled_from(CREDENTIAL_NAMES), value),
        st.builds(
            lambda k, v: lambda r: _set_header(r, k, v),
            st.sampled_from(["X-Custom", "OpenAI-Beta", "Accept"]),
            value,
        ),
        st.builds(
            lambda k, v: lambda r: _set_header(r, k, v), st.sampled_from(IGNORED), st.text("xyz", max_size=3)
        ),
        st.sampled_from(["application/json", "application/json; charset=utf-8"]).map(
            lambda v: lambda r: _set_header(r, "Content-Type", v)
        ),
        st.permutations(["model", "temperature", "messages", "prompt", "input", "tools", "metadata"]).map(
            lambda order: lambda r: replace(r, order=tuple(order))
        ),
        st.just(_swap_schema),
        st.just(_reorder_messages),
        st.sampled_from([{"b": 1, "a": 2}, {"a": 2, "b": 1}]).map(
            lambda v: lambda r: _set_field(r, "x_engine", v)
        ),
        st.sampled_from(["auto", "flex"]).map(lambda v: lambda r: _set_field(r, "service_tier", v)),
        st.sampled_from(["u1", "u2"]).map(lambda v: lambda r: _set_field(r, "user", v)),
        st.sampled_from([{"a": "1"}, {"a": "2"}]).map(lambda v: lambda r: _set_field(r, "metadata", v)),
        st.booleans().map(
            lambda s: lambda r: _set_field(r, "stream", s) if r.endpoint == "chat/completions" else r
        ),
        st.booleans().map(lambda raw: lambda r: replace(r, raw=raw and not r.query)),
    )


@st.composite
def neighbourhoods(draw: st.DrawFn) -> tuple[Req, list[Req]]:
    endpoint = draw(st.sampled_from(sorted(BASES)))
    base = Req(endpoint, draw(st.sampled_from(BASES[endpoint])))
    for change in draw(st.lists(changes(), max_size=2)):  # the base itself varies between examples
        base = change(base)
    return base, [draw(changes())(base) for _ in range(draw(st.integers(1, 3)))]


@dataclass
class Harness:
    """A gateway in front of the digest upstream, on a loop of its own (hypothesis drives plain functions)."""

    loop: asyncio.AbstractEventLoop
    upstream_url: str
    gw: RunningGateway
    session: aiohttp.ClientSession
    answered: list[str] = field(default_factory=list)  # Cache-Status of every 200

    def run(self, example: tuple[Req, list[Req]]) -> None:
        self.loop.run_until_complete(self.check(*example))

    async def check(self, base: Req, neighbours: list[Req]) -> None:
        for req in [base, *neighbours, base]:
            status, cache_status, digest = await self.send(req)
            assert status == 200, (status, req)
            self.answered.append(cache_status)
            if "hit" in cache_status.split(";")[1]:
                assert digest == await self.direct(req), (
                    f"{req} got another request's answer ({cache_status})"
                )

    async def send(self, req: Req) -> tuple[int, str, str]:
        if req.raw:
            return await _raw(self.gw, req)
        async with self.session.post(
            self.gw.url + req.path(), data=req.body_bytes(), headers=req.headers
        ) as resp:
            return resp.status, resp.headers.get("Cache-Status", ""), answer_digest(req, await resp.read())

    async def direct(self, req: Req) -> str:
        url = self.upstream_url + req.path()
        async with self.session.post(url, data=req.body_bytes(), headers=req.headers) as resp:
            return answer_digest(req, await resp.read())


def answer_digest(req: Req, body: bytes) -> str:
    if req.body.get("stream") is True:
        lines = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: {")]
        chunks = [orjson.loads(line) for line in lines]
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
    doc = orjson.loads(body)
    match req.endpoint:
        case "chat/completions":
            return str(doc["choices"][0]["message"]["content"])
        case "completions":
            return str(doc["choices"][0]["text"])
        case "embeddings":
            return bytes(int(x) for x in doc["data"][0]["embedding"]).hex()
        case _:
            return str(doc["output"][0]["content"][0]["text"])


async def _raw(gw: RunningGateway, req: Req) -> tuple[int, str, str]:
    """One request as raw bytes in one write, on its own keep-alive connection (what the fast lane takes)."""
    resp = await ask_kept_alive(gw.url, req.path(), list(req.headers), req.body_bytes())
    return resp.status, resp.headers.get("cache-status", ""), answer_digest(req, resp.body)


@pytest.fixture(params=["l1", "redis"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    cache: dict[str, Any] = {}
    if request.param == "redis":
        cache = {"redis_url": request.getfixturevalue("redis_url")}
    loop = asyncio.new_event_loop()

    async def start() -> Harness:
        upstream = await start_digest_upstream(DigestUpstream())
        url = str(upstream.make_url("")).rstrip("/")
        gw = await start_gateway(gateway_config(url, cache=cache), FakeClock())
        session = aiohttp.ClientSession(skip_auto_headers=NO_AUTO)
        harness = Harness(loop, url, gw, session)
        harness.upstream = upstream  # type: ignore[attr-defined]  # closed below
        return harness

    harness = loop.run_until_complete(start())
    try:
        yield harness
    finally:

        async def stop() -> None:
            await harness.session.close()
            await harness.gw.close()
            await harness.upstream.close()  # type: ignore[attr-defined]

        loop.run_until_complete(stop())
        loop.close()


PROPERTY = settings(
    max_examples=80,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(example=neighbourhoods())
def test_an_answer_from_an_entry_is_the_upstreams_answer_to_this_request(
    harness: Harness, example: tuple[Req, list[Req]]
) -> None:
    harness.run(example)


def test_the_property_exercises_hits_on_both_lanes(harness: Harness) -> None:
    """Not vacuous: across a run, the gateway answers from entries, and the fast lane answers some of them."""
    run = given(example=neighbourhoods())(PROPERTY(lambda example: harness.run(example)))
    run()
    hits = [s for s in harness.answered if "; hit" in s]
    metrics = harness.gw.state.metrics
    metrics.tally.flush()
    lane = sum(metrics.lane_answers.labels(tier)._value.get() for tier in ("l1", "l2"))
    assert len(hits) >= 40, harness.answered
    assert lane > 0


MUTATION = settings(PROPERTY, phases=[Phase.generate], max_examples=150, report_multiple_bugs=False)


def _without_keyed_query(
    real: Callable[[str], list[tuple[str, str]]],
) -> Callable[[str], list[tuple[str, str]]]:
    from gateway.keys.parts import query_part

    return lambda raw: [p for p in real(raw) if query_part(p[0]) is Part.CREDENTIAL]


def _without_credential(real: Callable[..., Part], name: str) -> Callable[..., Part]:
    return lambda header, *rest: Part.TRANSPORT if header == name else real(header, *rest)


def _sorting_everything(obj: Any) -> bytes:
    from gateway.keys.canonical import plain_json

    return orjson.dumps(plain_json(obj), option=orjson.OPT_SORT_KEYS)


@pytest.mark.parametrize("mutation", ["query not keyed", "x-goog-api-key not scoped", "schemas sorted"])
def test_mutation_checks_each_break_the_property(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    import gateway.hits.tenancy as tenancy
    import gateway.intake.pipeline as pipeline

    match mutation:
        case "query not keyed":
            monkeypatch.setattr(tenancy, "query_pairs", _without_keyed_query(tenancy.query_pairs))
        case "x-goog-api-key not scoped":
            monkeypatch.setattr(
                tenancy, "header_part", _without_credential(tenancy.header_part, "x-goog-api-key")
            )
        case _:
            monkeypatch.setattr(pipeline, "canonical_json", _sorting_everything)
    run = given(example=neighbourhoods())(MUTATION(lambda example: harness.run(example)))
    with pytest.raises(AssertionError, match="got another request's answer"):
        run()
