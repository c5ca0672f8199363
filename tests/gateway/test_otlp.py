"""gateway/ops/otlp.py: the lean OTLP encoder writes the message the SDK's encoder builds, and the exporter sends it.

The oracle is the SDK's own encoder (`encode_spans`): both run over the same finished spans, made by the SDK's tracer
(every attribute type, events, links, statuses, kinds, a remote parent with a tracestate, limits that drop) and by
the gateway's fast lane (`spans.lane_spans`), across two resources and two scopes; what `encode` writes, decoded by
`opentelemetry-proto`, must equal what the SDK builds. A mutation check breaks the encoder one way at a time and
sees the comparison fail.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.keys.canonical import Level
from gateway.ops import otlp
from gateway.ops.spans import lane_spans, sampled_parent
from gateway.ops.timing import StageTimer

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
VALUES: dict[str, Any] = {
    "s": "x",
    "empty": "",
    "utf8": "Grüße, 東京",
    "t": True,
    "f": False,
    "zero": 0,
    "int": 2**62,
    "negative": -5,
    "float": 1.5,
    "float_zero": 0.0,
    "strings": ["a", "b"],
    "ints": (1, -2, 3),
    "bools": [True, False],
    "floats": [0.5],
    "no_items": [],
}


def _sdk_spans(service: str, scope: str, version: str) -> list[ReadableSpan]:
    """Spans as the SDK's tracer finishes them: a server root under a remote parent, children of every kind."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "n": 1}),
        span_limits=SpanLimits(max_span_attributes=20, max_events=2, max_links=1),
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(scope, version, schema_url="https://opentelemetry.io/schemas/1.26.0")
    parent = TraceContextTextMapPropagator().extract({"traceparent": CALLER, "tracestate": "a=1,b=2"})
    with tracer.start_as_current_span("chat m", parent, kind=SpanKind.SERVER, attributes=VALUES) as root:
        root.add_event("first_token", {"n": 3})
        root.add_event("bare")
        for i, kind in enumerate((SpanKind.INTERNAL, SpanKind.CLIENT, SpanKind.PRODUCER, SpanKind.CONSUMER)):
            links = [Link(root.get_span_context(), {"why": "batch"}), Link(root.get_span_context())]
            with tracer.start_as_current_span(f"child {i}", kind=kind, links=links) as child:
                child.set_attributes({f"k{j}": j for j in range(25)})  # past the limit: 5 dropped
                for e in range(3):  # past max_events: one dropped
                    child.add_event(f"e{e}", {"i": e})
                if i == 1:
                    child.set_status(Status(StatusCode.ERROR, "upstream 502"))
                if i == 2:
                    child.set_status(Status(StatusCode.OK))
    return list(memory.get_finished_spans())


def _lane_spans(service: str) -> list[ReadableSpan]:
    """A fast-lane hit's spans as the gateway builds them (plain dict attributes, no live span)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    got: list[ReadableSpan] = []
    collector = types.SimpleNamespace(on_end=got.append)
    timer = StageTimer("chat/completions")
    for stage in ("parse", "l1", "serialize"):
        timer.lap(stage)
    timer.result, timer.reason = "hit", "fresh"
    parsed = types.SimpleNamespace(body={"model": "m"}, key_level=Level.EXACT)
    body = orjson.dumps({"choices": [{"finish_reason": "stop"}], "usage": {"prompt_tokens": 3}})
    entry = types.SimpleNamespace(usage=None, body=body)
    parent = sampled_parent(f"POST / HTTP/1.1\r\ntraceparent: {CALLER}\r\n\r\n".encode())
    assert parent is not None
    tracer = provider.get_tracer("tokenedge.gateway")
    lane_spans(tracer, collector, parent, ("chat/completions", parsed, entry, timer), True)  # type: ignore[arg-type]
    return got


@pytest.fixture(scope="module")
def spans() -> list[ReadableSpan]:
    return [
        *_sdk_spans("gw", "tokenedge.gateway", "1.0"),
        *_lane_spans("gw-lane"),
        *_sdk_spans("other", "other.scope", ""),
    ]


def _decoded(data: bytes) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(data)


def test_the_encoder_writes_the_message_the_sdk_builds(spans: list[ReadableSpan]) -> None:
    expected = encode_spans(spans)
    assert _decoded(otlp.encode(spans)) == expected
    # The comparison sees what matters: three resources, every span, the dropped counts, the remote parent.
    assert (
        len(expected.resource_spans) == 3
        and sum(len(s.spans) for r in expected.resource_spans for s in r.scope_spans) == len(spans) == 13
    )
    root = expected.resource_spans[0].scope_spans[0].spans[-1]
    assert root.trace_state == "a=1,b=2" and root.flags == 0x300 and root.events[1].name == "bare"
    assert expected.resource_spans[0].scope_spans[0].spans[0].dropped_attributes_count == 5


@pytest.mark.parametrize(
    ("helper", "broken"),
    [
        ("_status", lambda code, description: b""),  # the status left out
        ("_REMOTE_FLAGS", otlp._LOCAL_FLAGS),  # the parent's remoteness lost
        ("_count", lambda tag, n: b""),  # the dropped counts lost
        ("_trace_state", lambda tag, state: b""),  # the caller's tracestate lost
    ],
)
def test_the_comparison_sees_a_broken_encoder(
    spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch, helper: str, broken: Any
) -> None:
    monkeypatch.setattr(otlp, helper, broken)
    assert _decoded(otlp.encode(spans)) != encode_spans(spans)


def test_a_bool_is_not_encoded_as_an_int_nor_a_string_as_a_list() -> None:
    assert otlp._value(True) == b"\x10\x01" != otlp._value(1)
    assert otlp._value("ab") == b"\x0a\x02ab"
    # The cache of encoded attributes keys on the type: True == 1 and hashes alike, yet encodes otherwise.
    assert otlp._attributes(0x4A, {"same": 1}) != otlp._attributes(0x4A, {"same": True})
    assert otlp._attributes(0x4A, {"same": 1}) == otlp._field(0x4A, otlp._key_value("same", 1))


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[bytes]]]:
    """A real OTLP/HTTP receiver on loopback (a thread): every POST body kept."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies
    finally:
        server.shutdown()
        server.server_close()


def test_the_exporter_sends_the_lean_bytes_through_the_sdks_client(
    spans: list[ReadableSpan], receiver: tuple[str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, bodies = receiver
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    exporter = otlp.LeanSpanExporter(endpoint=url)
    encoded: list[int] = []
    lean = otlp.encode

    def spy(batch: Any) -> bytes:
        encoded.append(len(batch))
        return lean(batch)

    monkeypatch.setattr(otlp, "encode", spy)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert encoded == [len(spans)]  # the pinned SDK's client took the lean bytes: no fallback
    assert [_decoded(b) for b in bodies] == [encode_spans(spans)]
    exporter.shutdown()


def test_a_span_without_a_parent_has_no_parent_id_and_a_local_flag() -> None:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("root", kind=trace.SpanKind.INTERNAL):
        pass
    (span,) = memory.get_finished_spans()
    (decoded,) = _decoded(otlp.encode([span])).resource_spans[0].scope_spans[0].spans
    assert decoded == encode_spans([span]).resource_spans[0].scope_spans[0].spans[0]
    assert decoded.parent_span_id == b"" and decoded.flags == 0x100
