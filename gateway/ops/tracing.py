"""OpenTelemetry spans per cacheable request: the GenAI semantic conventions plus tokenedge's own attributes.

Off (the default), nothing here is imported from OpenTelemetry and a request pays one check (`state.tracing is
None`) in the handler or the fast lane; the deeper hooks (`span`, `active`) read one context variable that is
then None. On, a request first draws once at `sample_rate` (`keeps`); a dropped one (99 in 100 at 1%) creates
no OpenTelemetry object, attaches no context and is forwarded with the client's own `traceparent`. A kept one:
the handler opens the request's root span as a child of the client's `traceparent` (W3C Trace Context) and makes it
current; the intake, each cache read, the lease wait, the upstream call (a `first_token` event) and the store open
children of it, in the request's task and in the single-flight task it starts (asyncio copies the context). The
upstream receives a child `traceparent` naming the upstream-call span (`inject`), so an engine's own spans join the
trace; `traceparent` is transport in the request table (gateway/keys/parts.py), never key material.

A fast-lane hit is answered before any of this runs: the lane (gateway/edge/fastlane.py) calls `lane_hit` after
writing it (one check when off), which traces a kept hit only under a caller's sampled `traceparent`, its spans
built finished (gateway/ops/spans.py).

Export is OTLP/HTTP through the SDK's batch processor on its own thread (`flush` drains it; `OTEL_BSP_*` tune it).
The standard `OTEL_*` variables, where set, win over `[tracing]` (`settings_from`), as every OTel SDK reads them.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar, Token
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Protocol

from multidict import CIMultiDict

from gateway.config.sections import ConfigError, TracingConfig
from gateway.config.settings import GatewayConfig
from gateway.keys.entry import Entry
from gateway.keys.memo import ParsedRequest
from gateway.ops.spans import OPERATIONS, TRACER_NAME, answer_attributes, lane_spans, sampled_parent
from gateway.ops.timing import StageTimer

EXPORTERS = frozenset({"otlp", "none"})


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """What the tracer is built with; None: the SDK reads the standard variable itself (the variable is set)."""

    endpoint: str | None  # the full traces URL
    service_name: str | None
    sample_rate: float | None


def settings_from(config: TracingConfig, environ: Mapping[str, str]) -> TraceSettings | None:
    """Whether tracing is on, and with what: `[tracing]`, with the standard `OTEL_*` variables winning."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    named = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if named - EXPORTERS:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: the gateway exports by otlp only, got {sorted(named)}")
    if "none" in named or not (config.enabled or "otlp" in named):
        return None
    env_endpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in environ or "OTEL_EXPORTER_OTLP_ENDPOINT" in environ
    endpoint = None if env_endpoint or not config.endpoint else config.endpoint.rstrip("/") + "/v1/traces"
    service = None if "OTEL_SERVICE_NAME" in environ else config.service_name
    rate = None if "OTEL_TRACES_SAMPLER" in environ else config.sample_rate
    return TraceSettings(endpoint, service, rate)


class Tracing:
    """One per process, built at startup when tracing is on: the tracer provider, its exporter, the propagator."""

    def __init__(self, settings: TraceSettings, processor: Any = None) -> None:
        """`processor`: a span processor to use instead of OTLP/HTTP through a batch processor (tests)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attributes = {} if settings.service_name is None else {"service.name": settings.service_name}
        self.rate = settings.sample_rate
        self.draw = random.random
        # With a rate, the gateway samples: one draw per request (`keeps`) before any OpenTelemetry object exists,
        # for its own traces and a caller's sampled ones alike (a caller's ids need not be random in their low
        # bits: a counter, as the bench's ingress adds, would keep all or none of them by the trace-id rule).
        # The SDK's sampler then keeps what the draw kept, except under a caller's unsampled `traceparent`.
        sampler = None if self.rate is None else ParentBased(ALWAYS_ON)
        self.provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
        self.processor = processor or _batch_processor(settings)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self.propagator = TraceContextTextMapPropagator()

    def keeps(self) -> bool:
        """The request's one draw at `sample_rate` (the environment's sampler decides alone when it names one)."""
        return self.rate is None or self.draw() < self.rate

    def begin(self, headers: Mapping[str, str], endpoint: str) -> RequestTrace | None:
        """The request's root span, a child of the client's `traceparent`, made current; None when unsampled.
        The draw comes first: a dropped request creates nothing, attaches no context, and is forwarded with the
        client's own `traceparent` (`inject` leaves the headers as they are)."""
        if not self.keeps():
            return None
        from opentelemetry import context, trace

        parent = self.propagator.extract(headers)
        operation = OPERATIONS.get(endpoint, endpoint)
        root = self.tracer.start_span(
            operation, parent, kind=trace.SpanKind.SERVER, attributes={"gen_ai.operation.name": operation}
        )
        if not root.is_recording():  # a caller's unsampled traceparent, or the environment's sampler said no
            return None
        request_trace = RequestTrace(self, root)
        request_trace.otel_token = context.attach(trace.set_span_in_context(root, parent))
        request_trace.token = _ACTIVE.set(request_trace)
        return request_trace

    def lane_hit(
        self, raw: bytes, endpoint: str, parsed: ParsedRequest, entry: Entry, timer: StageTimer
    ) -> None:
        """A fast-lane hit (gateway/edge/fastlane.py) as a root span with its intake and cache-read children, when
        the request carries a sampled `traceparent` (`spans.lane_spans`); the lane's timer gives the times.
        Without one, the hit is answered untraced: the lane never starts a trace of its own."""
        # `keeps`, inline: the 99 in 100 hits a 1% rate drops pay these three lines and read no header
        rate = self.rate
        if rate is not None and self.draw() >= rate:
            return
        parent = sampled_parent(raw)
        if parent is not None:
            lane_spans(
                self.tracer, self.processor, parent, (endpoint, parsed, entry, timer), self.rate is not None
            )

    def flush(self, timeout_ms: int = 10_000) -> bool:
        """Export every finished span now (blocking: call it off the event loop when the receiver is on it)."""
        return bool(self.provider.force_flush(timeout_ms))

    def shutdown(self) -> None:
        self.provider.shutdown()


def _batch_processor(settings: TraceSettings) -> Any:
    """The SDK's batch processor (its own thread; `OTEL_BSP_*`) over OTLP/HTTP with the lean encoder (ops.otlp)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from gateway.ops.otlp import LeanSpanExporter

    exporter = (
        LeanSpanExporter() if settings.endpoint is None else LeanSpanExporter(endpoint=settings.endpoint)
    )
    return BatchSpanProcessor(exporter)


class RequestTrace:
    """One request's root span and what the hooks add to it; `finish` ends it and restores the context."""

    __slots__ = ("otel_token", "root", "token", "tracing")

    def __init__(self, tracing: Tracing, root: Any) -> None:
        self.tracing = tracing
        self.root = root
        self.token: Token[RequestTrace | None] | None = None
        self.otel_token: Any = None

    def set(self, attributes: Mapping[str, Any]) -> None:
        self.root.set_attributes(attributes)

    def model(self, model: Any) -> None:
        """Named once the body is parsed: the span takes the conventions' name `{operation} {model}`."""
        if isinstance(model, str):
            self.root.set_attribute("gen_ai.request.model", model)
            self.root.update_name(f"{self.root.name} {model}")

    def answered(self, usage: Mapping[str, Any] | None, body: bytes) -> None:
        """The answer's usage and finish reasons (a hit's or a stored miss's entry, or an upstream JSON body)."""
        self.root.set_attributes(answer_attributes(usage, body))

    def child(self, name: str, attributes: Mapping[str, Any] | None) -> AbstractContextManager[Any]:
        return self.tracing.tracer.start_as_current_span(name, attributes=attributes)

    def inject(self, headers: Mapping[str, str]) -> CIMultiDict[str]:
        """The upstream's headers with a `traceparent` (and `tracestate`) naming the current span: the client's own
        are replaced, so the engine's spans are children of the gateway's upstream call."""
        out: CIMultiDict[str] = CIMultiDict(headers)
        out.popall("traceparent", None)
        out.popall("tracestate", None)
        self.tracing.propagator.inject(out)
        return out

    def finish(self, result: str, reason: str) -> None:
        from opentelemetry import context

        self.root.set_attributes({"tokenedge.cache.status": result, "tokenedge.cache.reason": reason})
        if self.token is not None:
            _ACTIVE.reset(self.token)
        if self.otel_token is not None:
            context.detach(self.otel_token)
        self.root.end()


class TracedState(Protocol):
    """What the tracer's cleanup_ctx reads and sets on the gateway's state."""

    config: GatewayConfig
    tracing: Tracing | None


async def tracing_ctx(state: TracedState) -> AsyncIterator[None]:
    """One cleanup_ctx: the tracer when tracing is on (`settings_from`); its last spans exported at shutdown."""
    settings = settings_from(state.config.tracing, os.environ)
    if settings is None:
        yield
        return
    tracing = state.tracing = Tracing(settings)
    try:
        yield
    finally:
        state.tracing = None
        await asyncio.get_running_loop().run_in_executor(None, tracing.shutdown)  # blocking: an export


# The request being traced in this task (and the tasks it starts); None when tracing is off or unsampled.
_ACTIVE: ContextVar[RequestTrace | None] = ContextVar("tokenedge_trace", default=None)
_NO_SPAN: AbstractContextManager[Any] = nullcontext(None)


def answered(usage: Mapping[str, Any] | None, body: bytes, attributes: Mapping[str, Any]) -> None:
    """The answer's `gen_ai.*` usage and finish reasons, and `attributes`, on the root span, when traced."""
    trace = _ACTIVE.get()
    if trace is not None:
        trace.answered(usage, body)
        trace.set(attributes)


def inject(headers: Mapping[str, str]) -> Mapping[str, str]:
    """`headers` with a `traceparent` naming the current span, when traced (`RequestTrace.inject`)."""
    trace = _ACTIVE.get()
    return headers if trace is None else trace.inject(headers)


def read_attributes(found: Any, deepest: str, *, pre_read: bool) -> dict[str, Any]:
    """A cache read's span attributes: the tiers it read (L1, then L2 on an L1 miss), which one answered."""
    tier = found.tier if found is not None else ""
    tiers = "l1" if tier == "l1" or deepest == "l1" else "l1,l2"
    return {
        "tokenedge.cache.tiers_read": tiers,
        "tokenedge.cache.tier": tier or "none",
        "tokenedge.cache.pre_read": pre_read,  # the fast lane read it and did not serve it (gateway.hits.lookup)
    }


def active() -> RequestTrace | None:
    return _ACTIVE.get()


def span(name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A child span of the current one, or a shared no-op when this request is not traced (yields None)."""
    trace = _ACTIVE.get()
    return _NO_SPAN if trace is None else trace.child(name, attributes)


def event(name: str, attributes: Mapping[str, Any] | None = None) -> None:
    """An event on the current span (the upstream call's `first_token`), when traced."""
    if _ACTIVE.get() is not None:
        from opentelemetry import trace

        trace.get_current_span().add_event(name, attributes or {})


def annotate(attributes: Mapping[str, Any]) -> None:
    """Attributes on the request's root span, when traced."""
    trace = _ACTIVE.get()
    if trace is not None:
        trace.set(attributes)


@contextmanager
def lease_wait() -> Iterator[None]:
    """The lease wait as a span, its seconds on the root too (`tokenedge.lease.wait_s`)."""
    trace = _ACTIVE.get()
    if trace is None:
        yield
        return
    started = perf_counter()
    with trace.child("tokenedge.lease.wait", None):
        yield
    trace.set({"tokenedge.lease.wait_s": perf_counter() - started})
