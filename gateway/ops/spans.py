"""What a traced request's spans say (the GenAI semantic conventions), and a fast-lane hit's spans, built whole.

A fast-lane hit (gateway/edge/fastlane.py) is traced after it is written, from the lane's timer, so its three spans
(root, `tokenedge.intake`, `tokenedge.cache.read`) are finished when they are made: `lane_spans` builds them as
the SDK's finished-span record (`ReadableSpan`, what every span processor and exporter reads) and hands them to
the span processor, without the live-span machinery a span that is still open needs (a lock, bounded attribute and
event lists, attribute validation, a sampler call per span). A traced lane hit costs a fifth of the
instructions it took through `Tracer.start_span` (docs/performance.md, tracing). Its attributes are the gateway's
own few (strings, ints, a list of strings), far inside every span limit, so nothing is validated or truncated.

Importing this module imports no OpenTelemetry (tracing off imports none): `_otel` does, at the first traced hit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from functools import cache
from time import perf_counter_ns
from types import SimpleNamespace
from typing import Any

import orjson

from gateway.keys.entry import Entry
from gateway.keys.memo import ParsedRequest
from gateway.ops.timing import StageTimer

# https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/: gen_ai.operation.name per route
OPERATIONS: dict[str, str] = {
    "chat/completions": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "responses": "chat",
}
TRACER_NAME = "tokenedge.gateway"
LANE = "tokenedge.lane"  # on a fast-lane hit's root span: "fast"
# W3C Trace Context §3.2: version-traceid-parentid-flags, read from a request head's raw bytes by the fast lane
_TRACEPARENT = re.compile(
    rb"\r\ntraceparent:[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})[ \t]*\r\n",
    re.IGNORECASE,
)


def gen_ai_usage(usage: Mapping[str, Any] | None) -> dict[str, int]:
    """`gen_ai.usage.*` from an OpenAI usage object (Chat Completions' or Responses' names)."""
    if not usage:
        return {}
    out: dict[str, int] = {}
    for attr, names in (
        ("gen_ai.usage.input_tokens", ("prompt_tokens", "input_tokens")),
        ("gen_ai.usage.output_tokens", ("completion_tokens", "output_tokens")),
    ):
        value = next((usage[n] for n in names if isinstance(usage.get(n), int)), None)
        if value is not None:
            out[attr] = value
    return out


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def finish_reasons(doc: Mapping[str, Any]) -> list[str]:
    """`gen_ai.response.finish_reasons` of a JSON answer (empty when it names none)."""
    choices = doc.get("choices")
    if not isinstance(choices, list):
        return []
    return [
        c["finish_reason"] for c in choices if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
    ]


def answer_attributes(usage: Mapping[str, Any] | None, body: bytes) -> dict[str, Any]:
    """An answer's usage and finish reasons (a hit's or a stored miss's entry, or an upstream JSON body)."""
    doc = _json_object(body)
    if usage is None and isinstance(doc.get("usage"), dict):
        usage = doc["usage"]
    out: dict[str, Any] = gen_ai_usage(usage)
    reasons = finish_reasons(doc)
    if reasons:
        out["gen_ai.response.finish_reasons"] = reasons
    return out


def sampled_parent(raw: bytes) -> tuple[int, int, int] | None:
    """The caller's `traceparent` in a request head's raw bytes as (trace id, span id, flags), when it is valid
    and sampled; None otherwise (the lane never starts a trace of its own)."""
    match = _TRACEPARENT.search(raw, 0, raw.find(b"\r\n\r\n") + 2)
    if match is None or match[1].lower() == b"ff":
        return None
    trace_id, span_id, flags = int(match[2], 16), int(match[3], 16), int(match[4], 16)
    return (trace_id, span_id, flags) if trace_id and span_id and flags & 1 else None


@cache
def _otel() -> SimpleNamespace:
    """The OpenTelemetry names `lane_spans` uses, imported once (an import statement per hit costs as much as a
    span), and the tracer's instrumentation scope, as `TracerProvider.get_tracer(TRACER_NAME)` makes it."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

    return SimpleNamespace(
        ReadableSpan=ReadableSpan,
        SpanContext=SpanContext,
        SpanKind=SpanKind,
        TraceFlags=TraceFlags,
        NonRecordingSpan=NonRecordingSpan,
        set_span_in_context=set_span_in_context,
        scope=InstrumentationScope(TRACER_NAME, ""),
    )


def _hit_attributes(
    operation: str, attributes: dict[str, Any], parsed: ParsedRequest, entry: Entry, timer: StageTimer
) -> tuple[str, str]:
    """A lane hit's root attributes, added to `attributes`; its span name and the tier that answered."""
    name, model = operation, parsed.body.get("model")
    if isinstance(model, str):  # the conventions' name once the model is known: `{operation} {model}`
        name = f"{operation} {model}"
        attributes["gen_ai.request.model"] = model
    if parsed.key_level is not None:
        attributes["tokenedge.key.level"] = parsed.key_level.value
    attributes |= answer_attributes(entry.usage, entry.body)
    tier = "l2" if "l2" in timer.stages else "l1"
    attributes |= {
        "tokenedge.cache.tier": tier,
        "tokenedge.cache.status": timer.result,
        "tokenedge.cache.reason": timer.reason,
    }
    return name, tier


def lane_spans(
    tracer: Any,
    processor: Any,
    parent_ids: tuple[int, int, int],
    hit: tuple[str, ParsedRequest, Entry, StageTimer],
    drawn: bool,
) -> None:
    """A fast-lane hit's root span and its intake and cache-read children, under the caller's sampled parent,
    handed to `processor` finished. `tracer`: the SDK tracer (its resource, ids and, where the environment names
    one, sampler: `drawn` False asks it, as `Tracer.start_span` would; True: the gateway's draw kept the hit)."""
    otel = _otel()
    ReadableSpan, SpanContext, SpanKind, TraceFlags = (
        otel.ReadableSpan,
        otel.SpanContext,
        otel.SpanKind,
        otel.TraceFlags,
    )
    endpoint, parsed, entry, timer = hit
    trace_id, parent_span, flags = parent_ids
    parent = SpanContext(trace_id, parent_span, is_remote=True, trace_flags=TraceFlags(flags))
    operation = OPERATIONS.get(endpoint, endpoint)
    attributes: dict[str, Any] = {LANE: "fast", "gen_ai.operation.name": operation}
    if not drawn:  # the environment's sampler (OTEL_TRACES_SAMPLER) decides, as for any span
        inside = otel.set_span_in_context(otel.NonRecordingSpan(parent))
        result = tracer.sampler.should_sample(inside, trace_id, operation, SpanKind.SERVER, attributes)
        if not result.decision.is_sampled():
            return
    name, tier = _hit_attributes(operation, attributes, parsed, entry, timer)
    to_ns = time.time_ns() - perf_counter_ns()  # perf_counter seconds -> epoch nanoseconds
    at = [to_ns + int(timer.started * 1e9)]
    for seconds in timer.stages.values():
        at.append(at[-1] + int(seconds * 1e9))
    new_id, span_flags = tracer.id_generator.generate_span_id, TraceFlags(flags | TraceFlags.SAMPLED)
    root = SpanContext(trace_id, new_id(), is_remote=False, trace_flags=span_flags)
    common = {"resource": tracer.resource, "instrumentation_scope": otel.scope}
    reads = {"tokenedge.cache.tiers_read": "l1" if tier == "l1" else "l1,l2", "tokenedge.cache.tier": tier}
    for child, start, end, child_attributes in (
        ("tokenedge.intake", at[0], at[1], {}),
        ("tokenedge.cache.read", at[1], at[2], reads),
    ):
        context = SpanContext(trace_id, new_id(), is_remote=False, trace_flags=span_flags)
        processor.on_end(
            ReadableSpan(
                child, context, root, attributes=child_attributes, start_time=start, end_time=end, **common
            )
        )
    processor.on_end(
        ReadableSpan(
            name,
            root,
            parent,
            attributes=attributes,
            kind=SpanKind.SERVER,
            start_time=at[0],
            end_time=at[-1],
            **common,
        )
    )
