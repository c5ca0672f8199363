"""OTLP/HTTP span export with a lean encoder: the protobuf wire bytes of an `ExportTraceServiceRequest`, written
directly from the finished spans.

The SDK's encoder builds a protobuf object per span, attribute and value, then serializes them: with the POST,
about 233,000 instructions a span, where the gateway's batch thread spent most of tracing's cost at a 1% sample
rate. Writing the bytes (encoded attributes cached: a gateway span's repeat) brings that to about 85,000
(docs/performance.md, tracing). The message is the SDK's own: tests/gateway/test_otlp.py decodes what `encode`
writes and compares it with what the SDK's encoder builds, over spans with every attribute type, events, links,
statuses and parents.

`LeanSpanExporter` is the SDK's `OTLPSpanExporter` (the `OTEL_EXPORTER_OTLP_*` variables, headers, compression,
TLS, retries and backoff are all its) with the encoding replaced. It sends through the SDK exporter's HTTP client,
an internal of the pinned SDK: where a later SDK lacks it, every batch takes the SDK's own `export` instead.
Imported only when tracing is on (gateway/ops/tracing.py).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_FIXED32 = struct.Struct("<I")
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: the parent's remoteness is known / it is remote
_INT64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, data: bytes) -> bytes:
    """A length-delimited field (`tag` is the field number shifted, wire type 2)."""
    return bytes((tag,)) + _varint(len(data)) + data


def _value(value: Any) -> bytes:
    """An `AnyValue`'s bytes, in the SDK encoder's order of type checks (bool before int, str before Sequence)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(0x0A, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value & _INT64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(0x3A, value)
    if isinstance(value, Sequence):
        return _field(0x2A, b"".join(_field(0x0A, _value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(0x32, b"".join(_field(0x0A, _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"an attribute of type {type(value).__name__}: {value!r}")


def _key_value(key: str, value: Any) -> bytes:
    return _field(0x0A, key.encode()) + _field(0x12, _value(value))


# A `KeyValue` field's bytes by (tag, key, type, value), for str, int and bool values: a gateway span's attributes
# repeat (the operation, model, tier, status...), so most are encoded once. Bounded: cleared when full.
_ENCODED: dict[tuple[int, str, type, Any], bytes] = {}
_CACHED_TYPES = (str, int, bool)
_CACHE_SIZE = 4096


def _attributes(tag: int, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    out = []
    for k, v in attributes.items():
        kind = type(v)
        if kind not in _CACHED_TYPES:
            out.append(_field(tag, _key_value(k, v)))
            continue
        cached = _ENCODED.get((tag, k, kind, v))
        if cached is None:
            if len(_ENCODED) >= _CACHE_SIZE:
                _ENCODED.clear()
            cached = _ENCODED[(tag, k, kind, v)] = _field(tag, _key_value(k, v))
        out.append(cached)
    return b"".join(out)


def _count(tag: int, n: int) -> bytes:
    return bytes((tag,)) + _varint(n) if n else b""


def _trace_state(tag: int, state: Any) -> bytes:
    return _field(tag, ",".join(f"{k}={v}" for k, v in state.items()).encode()) if state else b""


# Span.flags (field 16, fixed32): the parent's remoteness is known, and whether it is remote
_LOCAL_FLAGS = b"\x85\x01" + _FIXED32.pack(_HAS_IS_REMOTE)
_REMOTE_FLAGS = b"\x85\x01" + _FIXED32.pack(_HAS_IS_REMOTE | _IS_REMOTE)
_KINDS = {
    kind: b"\x30" + _varint(kind.value + 1) for kind in SpanKind
}  # the protobuf's counts from UNSPECIFIED


def _events(events: Sequence[Any]) -> bytes:
    return b"".join(
        _field(
            0x5A,
            b"\x09"
            + _FIXED64.pack(e.timestamp)
            + _field(0x12, e.name.encode())
            + _attributes(0x1A, e.attributes)
            + _count(0x20, e.dropped_attributes),
        )
        for e in events
    )


def _links(links: Sequence[Any]) -> bytes:
    return b"".join(
        _field(
            0x6A,
            b"\x0a\x10"
            + link.context.trace_id.to_bytes(16, "big")
            + b"\x12\x08"
            + link.context.span_id.to_bytes(8, "big")
            + _attributes(0x22, link.attributes)
            + _count(0x28, link.dropped_attributes)
            + b"\x35"
            + _FIXED32.pack(_HAS_IS_REMOTE | (_IS_REMOTE if link.context.is_remote else 0)),
        )
        for link in links
    )


@lru_cache(maxsize=256)
def _status(code: int, description: str | None) -> bytes:
    """Always present, as the SDK encodes it (an unset status is an empty message)."""
    message = _field(0x12, description.encode()) if description else b""
    return _field(0x7A, message + (b"\x18" + _varint(code) if code != StatusCode.UNSET.value else b""))


def encode_span(span: ReadableSpan) -> bytes:
    """One `Span` message's bytes."""
    context, parent = span.context, span.parent
    assert context is not None and span.start_time is not None and span.end_time is not None
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        parts.append(_trace_state(0x1A, context.trace_state))
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    parts += (_field(0x2A, span.name.encode()), _KINDS[span.kind])
    parts += (b"\x39", _FIXED64.pack(span.start_time), b"\x41", _FIXED64.pack(span.end_time))
    parts += (_attributes(0x4A, span.attributes), _count(0x50, span.dropped_attributes))
    events, links = span.events, span.links
    if events:
        parts.append(_events(events))
    if links:
        parts.append(_links(links))
    parts += (_count(0x60, span.dropped_events), _count(0x70, span.dropped_links))
    parts.append(_status(span.status.status_code.value, span.status.description))
    parts.append(_REMOTE_FLAGS if parent is not None and parent.is_remote else _LOCAL_FLAGS)
    return b"".join(parts)


def _scope_spans(scope: Any, encoded: list[bytes]) -> bytes:
    """A `ScopeSpans` message: the instrumentation scope, its spans, its schema URL."""
    head = b""
    if scope is not None:
        head = _field(0x0A, scope.name.encode()) if scope.name else b""
        head += _field(0x12, scope.version.encode()) if scope.version else b""
        head += _attributes(0x1A, scope.attributes)
    schema = scope.schema_url if scope is not None else None
    tail = _field(0x1A, schema.encode()) if schema else b""
    return _field(0x12, _field(0x0A, head) + b"".join(_field(0x12, s) for s in encoded) + tail)


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """An `ExportTraceServiceRequest`'s bytes: the spans grouped by resource, then by instrumentation scope."""
    groups: dict[int, tuple[Any, dict[tuple[Any, ...], tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope or None
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        key = (
            ()
            if scope is None
            else (scope.name, scope.version, scope.schema_url, *(scope.attributes or {}).items())
        )
        scopes.setdefault(key, (scope, []))[1].append(encode_span(span))
    out = []
    for resource, scopes in groups.values():
        body = _field(0x0A, _attributes(0x0A, resource.attributes))
        body += b"".join(_scope_spans(scope, encoded) for scope, encoded in scopes.values())
        body += _field(0x1A, resource.schema_url.encode()) if resource.schema_url else b""
        out.append(_field(0x0A, body))
    return b"".join(out)


class LeanSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, encoding with `encode`. What it leaves out of the SDK's `export`: the
    exporter's own metrics (off unless `OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`) and the 64 MiB request cap (a
    batch of 512 gateway spans is about 150 KB)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        client = getattr(self, "_client", None)
        if client is None or not hasattr(client, "export") or getattr(self, "_shutdown", True):
            return super().export(spans)  # a later SDK, or shut down: the SDK's own path
        return SpanExportResult.SUCCESS if client.export(encode(spans)).success else SpanExportResult.FAILURE
