"""gateway/ops/tracing.py: spans per request, exported by OTLP/HTTP to a real receiver in the test.

The receiver is an aiohttp server on loopback that accepts `POST /v1/traces` and decodes the protobuf with
`opentelemetry-proto`'s `ExportTraceServiceRequest`, as a collector would. The gateway's batch processor is drained
with `Tracing.flush` (off the event loop: the receiver answers on it), so no test waits on a timer.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from gateway.config.sections import ConfigError, TracingConfig
from gateway.ops.tracing import TraceSettings, settings_from
from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[str]
    start: int = 0
    end: int = 0


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every span of every export, decoded."""

    spans: list[Span] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)

    async def traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            self.resources.append({a.key: _value(a.value) for a in resource_spans.resource.attributes})
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(
                        Span(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            {a.key: _value(a.value) for a in s.attributes},
                            [e.name for e in s.events],
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def roots(self) -> list[Span]:
        return [s for s in self.spans if s.parent_id == CALLER_SPAN]

    def under(self, root: Span) -> dict[str, Span]:
        """The root's descendants by name; of the upstream calls, the completion's (the catalog's are traced too)."""
        ids, found = {root.span_id}, {}
        for _ in range(5):  # depth: root -> lease wait -> upstream
            for s in self.spans:
                if s.parent_id in ids and s.span_id not in ids:
                    ids.add(s.span_id)
                    if s.name != "tokenedge.upstream" or s.attributes["url.path"].startswith("/v1/chat/"):
                        found[s.name] = s
        return found


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Receiver, str]]:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the exporter's requests session reads the environment
    got = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", got.traces)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield got, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def flush(gw: RunningGateway) -> None:
    tracing = gw.state.tracing
    assert tracing is not None
    assert await asyncio.get_running_loop().run_in_executor(None, tracing.flush)


async def ask(gw: RunningGateway, body: dict[str, Any], traceparent: str = TRACEPARENT) -> tuple[str, bytes]:
    headers = {**AUTH_A, "traceparent": traceparent}
    async with gw.client.post("/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        return resp.headers["Cache-Status"], await resp.read()


def assert_gen_ai(root: Span) -> None:
    """The GenAI conventions' attributes of a root span for CHAT, as the fake upstream answers it."""
    assert root.name == "chat test-model" and root.kind == 2  # SPAN_KIND_SERVER
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.request.model"] == "test-model"
    assert root.attributes["gen_ai.usage.input_tokens"] == 10
    assert root.attributes["gen_ai.usage.output_tokens"] == 5
    assert root.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert root.attributes["tokenedge.key.level"] in ("exact", "tokens")


@pytest.mark.parametrize("fast_lane", [True, False])
async def test_a_miss_and_a_hit_are_spans_under_the_callers_traceparent(
    make_gateway: GatewayFactory,
    fake: FakeUpstream,
    receiver: tuple[Receiver, str],
    redis_url: str,
    fast_lane: bool,
) -> None:
    got, url = receiver
    gw = await make_gateway(
        cache={"redis_url": redis_url},
        server={"fast_lane": fast_lane},
        tracing={"enabled": True, "endpoint": url},
    )
    miss_status, miss_body = await ask(gw, CHAT)
    hit_status, hit_body = await ask(gw, CHAT)
    assert "fwd=miss" in miss_status and "hit" in hit_status and hit_body == miss_body
    await flush(gw)

    miss, hit = got.roots()
    assert {s.trace_id for s in got.spans} == {TRACE_ID}
    assert got.resources[0]["service.name"] == "tokenedge-gateway"
    for root in (miss, hit):
        assert_gen_ai(root)
    assert miss.attributes["tokenedge.cache.status"] == "miss"
    assert miss.attributes["tokenedge.coalesced"] is False
    assert miss.attributes["tokenedge.lease.wait_s"] >= 0
    assert hit.attributes["tokenedge.cache.status"] == "hit"
    assert hit.attributes["tokenedge.cache.tier"] == "l1"
    assert hit.attributes.get("tokenedge.lane") == ("fast" if fast_lane else None)  # the lane answered it

    children = got.under(miss)
    assert {
        "tokenedge.intake",
        "tokenedge.intake.key",
        "tokenedge.cache.read",
        "tokenedge.lease.wait",
        "tokenedge.upstream",
        "tokenedge.cache.store",
    } <= set(children)
    assert children["tokenedge.cache.read"].attributes["tokenedge.cache.tiers_read"] == "l1,l2"
    assert children["tokenedge.cache.read"].attributes["tokenedge.cache.tier"] == "none"
    upstream = children["tokenedge.upstream"]
    assert "first_token" in upstream.events
    assert upstream.attributes["http.response.status_code"] == 200

    hit_children = got.under(hit)
    assert {"tokenedge.intake", "tokenedge.cache.read"} <= set(hit_children)
    intake, read = hit_children["tokenedge.intake"], hit_children["tokenedge.cache.read"]
    assert (
        hit.start <= intake.start <= intake.end <= read.start <= read.end <= hit.end
    )  # in order, inside the hit
    assert ("tokenedge.intake.key" in hit_children) is not fast_lane  # the lane's intake is the memo's key
    assert "tokenedge.upstream" not in hit_children
    assert hit_children["tokenedge.cache.read"].attributes["tokenedge.cache.tier"] == "l1"

    # The upstream saw one request, with a child traceparent: this trace, the gateway's upstream-call span.
    (sent,) = [h for h in fake.headers if "traceparent" in h]
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert span_id == upstream.span_id != CALLER_SPAN


async def test_a_streamed_miss_has_its_first_token_and_its_store(
    make_gateway: GatewayFactory, fake: FakeUpstream, receiver: tuple[Receiver, str]
) -> None:
    got, url = receiver
    gw = await make_gateway(tracing={"enabled": True, "endpoint": url})
    status, _ = await ask(gw, {**CHAT, "stream": True})
    assert "fwd=miss" in status
    await flush(gw)
    (root,) = got.roots()
    assert root.attributes["tokenedge.cache.status"] == "miss"
    assert root.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    children = got.under(root)
    assert "first_token" in children["tokenedge.upstream"].events
    assert "tokenedge.cache.store" in children
    assert fake.headers[-1]["traceparent"].split("-")[2] == children["tokenedge.upstream"].span_id


async def test_an_unsampled_request_exports_nothing_and_forwards_the_callers_traceparent(
    make_gateway: GatewayFactory, fake: FakeUpstream, receiver: tuple[Receiver, str]
) -> None:
    got, url = receiver
    unsampled = f"00-{TRACE_ID}-{CALLER_SPAN}-00"
    gw = await make_gateway(tracing={"enabled": True, "endpoint": url})
    await ask(gw, CHAT, traceparent=unsampled)
    await ask(gw, {**CHAT, "max_tokens": 7})  # sampled by the caller: kept (sample_rate 1)
    await flush(gw)
    assert fake.headers[0]["traceparent"] == unsampled
    assert [r.attributes["tokenedge.cache.status"] for r in got.roots()] == ["miss"]


@pytest.mark.parametrize("fast_lane", [True, False])
@pytest.mark.parametrize(("rate", "kept"), [(1.0, ["miss", "hit", "hit"]), (0.0, [])])
async def test_a_callers_sampled_traces_are_kept_at_the_sample_rate_on_either_path(
    make_gateway: GatewayFactory,
    receiver: tuple[Receiver, str],
    fast_lane: bool,
    rate: float,
    kept: list[str],
) -> None:
    got, url = receiver
    gw = await make_gateway(
        server={"fast_lane": fast_lane}, tracing={"enabled": True, "endpoint": url, "sample_rate": rate}
    )
    for _ in range(3):  # a miss, then hits
        await ask(gw, CHAT)
    async with gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A) as resp:
        assert "hit" in resp.headers["Cache-Status"]  # no traceparent: the lane starts no trace of its own
    await flush(gw)
    assert [r.attributes["tokenedge.cache.status"] for r in got.roots()] == kept
    lane = [r for r in got.spans if r.attributes.get("tokenedge.lane") == "fast"]
    assert len(lane) == (2 if fast_lane and kept else 0)


@pytest.mark.parametrize("fast_lane", [True, False])
async def test_each_request_draws_once_and_a_dropped_one_is_forwarded_with_the_callers_traceparent(
    make_gateway: GatewayFactory, fake: FakeUpstream, receiver: tuple[Receiver, str], fast_lane: bool
) -> None:
    got, url = receiver
    gw = await make_gateway(
        server={"fast_lane": fast_lane}, tracing={"enabled": True, "endpoint": url, "sample_rate": 0.01}
    )
    assert gw.state.tracing is not None
    draws = iter([0.5, 0.009, 0.5, 0.0])  # one per request: dropped miss, kept hit, dropped hit, kept hit
    gw.state.tracing.draw = draws.__next__
    statuses = [(await ask(gw, CHAT))[0] for _ in range(4)]
    assert next(draws, None) is None  # each request drew exactly once, the spans inside it none
    await flush(gw)
    assert "fwd=miss" in statuses[0] and all("hit" in s for s in statuses[1:])
    assert [r.attributes["tokenedge.cache.status"] for r in got.roots()] == ["hit", "hit"]
    assert fake.headers[0]["traceparent"] == TRACEPARENT  # the dropped miss: the caller's own, unchanged


@pytest.mark.parametrize("fast_lane", [True, False])
@pytest.mark.parametrize(("sampler", "kept"), [("always_off", []), ("always_on", ["miss", "hit"])])
async def test_the_environments_sampler_decides_on_either_path_when_it_names_one(
    make_gateway: GatewayFactory,
    receiver: tuple[Receiver, str],
    monkeypatch: pytest.MonkeyPatch,
    fast_lane: bool,
    sampler: str,
    kept: list[str],
) -> None:
    got, url = receiver
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    gw = await make_gateway(server={"fast_lane": fast_lane}, tracing={"enabled": True, "endpoint": url})
    for _ in range(2):
        await ask(gw, CHAT)
    await flush(gw)
    assert [r.attributes["tokenedge.cache.status"] for r in got.roots()] == kept


OFF_PROBE = """
import asyncio, sys, orjson
from aiohttp import web
from gateway.app import create_app
from gateway.config.settings import GatewayConfig

async def main():
    config = GatewayConfig.from_mapping({"upstream": {"url": "http://127.0.0.1:9"}, "server": {"state_dir": sys.argv[1]}})
    before = set(sys.modules)  # redis-py imports parts of opentelemetry itself when it is installed
    runner = web.AppRunner(create_app(config))
    await runner.setup()  # every cleanup_ctx's start, the tracer's included
    loaded = sorted(m for m in set(sys.modules) - before if m.startswith("opentelemetry"))
    loaded += sorted(m for m in sys.modules if m.startswith("opentelemetry.exporter"))
    await runner.cleanup()
    print(orjson.dumps(loaded).decode())

asyncio.run(main())
"""


def test_tracing_off_starts_no_opentelemetry(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    run = subprocess.run(
        [sys.executable, "-c", OFF_PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert orjson.loads(run.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize(
    ("config", "environ", "expected"),
    [
        (TracingConfig(), {}, None),  # off by default
        (TracingConfig(enabled=True), {"OTEL_SDK_DISABLED": "true"}, None),
        (TracingConfig(enabled=True), {"OTEL_TRACES_EXPORTER": "none"}, None),
        (TracingConfig(), {"OTEL_TRACES_EXPORTER": "otlp"}, TraceSettings(None, "tokenedge-gateway", 1.0)),
        (
            TracingConfig(enabled=True, endpoint="http://c:4318/", service_name="gw", sample_rate=0.01),
            {},
            TraceSettings("http://c:4318/v1/traces", "gw", 0.01),
        ),
        (  # the standard variables win: the SDK reads them itself
            TracingConfig(enabled=True, endpoint="http://c:4318", sample_rate=0.5),
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://d:4318",
                "OTEL_SERVICE_NAME": "x",
                "OTEL_TRACES_SAMPLER": "x",
            },
            TraceSettings(None, None, None),
        ),
    ],
)
def test_settings_follow_the_config_and_the_standard_variables(
    config: TracingConfig, environ: dict[str, str], expected: TraceSettings | None
) -> None:
    assert settings_from(config, environ) == expected


def test_an_exporter_the_gateway_lacks_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="otlp only"):
        settings_from(TracingConfig(), {"OTEL_TRACES_EXPORTER": "zipkin"})
