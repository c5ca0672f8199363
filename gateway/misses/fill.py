"""Cache fill for JSON responses: one upstream call, the store decision (design §4), and the store itself.

Runs inside a single-flight task, so the entry is in the cache before any coalesced follower is released.
P2 (docs/coherence.md): a fill takes its store ticket (`store_ticket`, the purge generation and epoch) before the
upstream call and stores under it, so a purge that lands while the upstream answers is never undone by the store;
the stream tee (`gateway.misses.tee`) does the same.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.keys.derive import entry_tags
from gateway.keys.entry import Entry
from gateway.keys.policy import USAGE_ENDPOINTS, Reason, error_body, store_refusal
from gateway.misses.answer import FillRequest, make_entry, revision_moved
from gateway.misses.needs import MissState
from gateway.misses.streaming.responses import response_finish
from gateway.ops import tracing
from gateway.tiers.tiered import Ticket
from gateway.upstream.http import UpstreamResponse

__all__ = [
    "FillRequest",
    "FillResult",
    "completion_facts",
    "fill",
    "store_ticket",
]  # FillRequest lives in gateway.misses.answer


@dataclass(frozen=True, slots=True)
class FillResult:
    response: UpstreamResponse
    entry: Entry | None
    refusal: Reason | None
    collapsed: bool = False  # the entry another replica stored under its lease (gateway/misses/lease_fill.py)


def completion_facts(
    body: bytes, endpoint: str = ""
) -> tuple[list[str | None], Mapping[str, Any] | None, bool] | None:
    """(finish reasons, usage, whether it is an error body: `policy.error_body`) of a JSON answer; None when the
    body is not a JSON object."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    error = error_body(endpoint, doc)
    if doc.get("object") == "response":
        usage = doc.get("usage")
        return [response_finish(doc)], usage if isinstance(usage, dict) else None, error
    choices = doc.get("choices")
    reasons = (
        [c.get("finish_reason") for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []
    )
    usage = doc.get("usage")
    return reasons, usage if isinstance(usage, dict) else None, error


async def store_ticket(state: MissState, req: FillRequest) -> Ticket:
    """P2: what the entry of `req` will be stored under, taken before its upstream call."""
    key = req.key
    tags = entry_tags(model=req.model, revision=req.revision, scope=key.scope, digest=key.digest)
    return await state.cache.ticket(key.key, tags)


async def fill(state: MissState, req: FillRequest) -> FillResult:
    ticket = await store_ticket(state, req)
    started = time.perf_counter()
    resp = await (req.via or state.upstream).request("POST", req.path_qs, req.headers, req.body)
    state.metrics.upstream_duration.labels(req.endpoint).observe(time.perf_counter() - started)
    facts = completion_facts(resp.body, req.endpoint) if resp.status == 200 else None
    encoded = resp.headers.get("Content-Encoding", "identity").lower() not in ("identity", "")
    refusal = store_refusal(
        status=resp.status,
        body_bytes=len(resp.body),
        max_entry_bytes=state.config.cache.max_entry_bytes,
        complete=facts is not None and not encoded,
        finish_reasons=facts[0] if facts else (),
        has_usage=(facts is not None and facts[1] is not None) or req.endpoint not in USAGE_ENDPOINTS,
        error=facts is not None and facts[2],
    )
    if refusal is None and revision_moved(state, req, resp.headers):
        refusal = Reason.REVISION
    if refusal is not None or facts is None:
        return FillResult(resp, None, refusal or Reason.INCOMPLETE)
    entry = make_entry(state, req, resp.body, facts[1])
    with tracing.span("tokenedge.cache.store"):
        await state.cache.put(entry, ticket)  # P2: dropped by each tier a purge reached since the ticket
    return FillResult(resp, entry, None)
