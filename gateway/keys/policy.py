"""Cache policy (design §4): whether to look up, what may be stored, and how old is too old.

Pure decisions over an already validated request; the handlers do the I/O. Only deterministic requests are
cached, since a cache answering a sampled request would replace the variety the client asked for with one
frozen draw. Every outcome carries a `Reason`, the label in metrics and in `Cache-Status: ...; detail=`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.keys.cache_control import RequestDirectives
from gateway.keys.canonical import TEXT_FIELDS

# The cacheable routes, defined once: config, metrics, the app's routes and the fast lane take them from here.
CACHEABLE_ENDPOINTS: tuple[str, ...] = ("chat/completions", "completions", "embeddings", "responses")
RESPONSES = "responses"
# Generation: an entry may answer a later request whose answer carries usage (a JSON one, a stream with
# `include_usage`). An embeddings entry is the upstream's own JSON, the whole of what any later request gets.
USAGE_ENDPOINTS = frozenset({"chat/completions", "completions", RESPONSES})
# Responses tools the upstream runs itself: their results follow the world (a search, a file store), not the input.
_CLIENT_TOOLS = frozenset({"function", "custom"})
_DETERMINISTIC_ENDPOINTS = frozenset({"embeddings"})  # the same input always embeds to the same vector
# Engine samplers that draw whatever the temperature (`_live_reason`).
_DRAWING_SAMPLERS = ("xtc_probability", "dynatemp_range", "mirostat", "mirostat_mode")
# Upstream answers about the caller, not about the request: on a public route a coalesced follower (maybe another
# tenant) must not be handed the leader's refusal.
CREDENTIAL_REFUSALS = frozenset({401, 403, 429})


class Reason(StrEnum):
    """Why a request was not served from, or a response not written to, the cache."""

    # decide(): bypass, neither lookup nor store
    ENDPOINT = "endpoint"  # not a cacheable endpoint
    ROUTE_OFF = "route-off"  # caching disabled for the route
    NO_STORE = "no-store"  # the request's Cache-Control: no-store
    TEMPERATURE = "temperature"  # sampled: temperature is not 0 (absent means 1)
    SEED = (
        "seed"  # sampled but seeded: the upstream does not promise invariant seeded sampling, nor the route
    )
    N = "n"  # more than one choice requested
    STATEFUL = (
        "stateful"  # a Responses request the upstream keeps or continues (store, previous_response_id, ...)
    )
    HOSTED_TOOL = "hosted-tool"  # a tool the upstream runs (web search, file search, ...): live results
    REMOTE_INPUT = (
        "remote-input"  # an input by reference to mutable content (an http(s) URL, a file id, an item)
    )
    SAMPLER = (
        "sampler"  # an engine sampler that draws even at temperature 0 (llama.cpp's XTC, dynamic temperature)
    )
    # store_refusal(): the response is forwarded but not stored
    STATUS = "status"  # not HTTP 200
    INCOMPLETE = "incomplete"  # the stream ended without [DONE], or a choice was aborted
    CONTENT_FILTER = "content-filter"  # a choice was cut by the content filter
    ERROR = "error"  # the upstream reported an error inside a 200 response
    TOO_LARGE = "too-large"  # over the per-entry byte cap
    REVISION = "revision-changed"  # the answer names a newer model revision than the key: learned, not stored
    NO_USAGE = "no-usage"  # a JSON answer without usage is not stored; an entry without it misses (`lacks`)
    # lacks(): an entry that cannot answer this request's form (a miss, with this detail)
    STREAM_ONLY = "stream-only"  # the entry's stream holds a field no rule turns into JSON (streaming.forms)
    # lookup outcomes the handlers report (not returned here)
    NO_CACHE = "no-cache"  # Cache-Control: no-cache, lookup skipped, answer stored
    MAX_AGE = "max-age"  # an entry was found but is older than the request's max-age
    ONLY_IF_CACHED = "only-if-cached"  # a miss under only-if-cached (504)


class Result(StrEnum):
    """How a cacheable request was answered: the `result` label of `tokenedge_requests_total` (design §7)."""

    HIT = "hit"
    MISS = "miss"  # this request's own upstream call (the flight's leader)
    COALESCED = "coalesced"  # answered by another request's upstream call (a follower)
    STALE = "stale"  # stale-if-error: the upstream failed and a stale entry was served
    BYPASS = "bypass"
    ERROR = "error"
    CLIENT_GONE = "client_gone"  # the client left before its answer was written: counted, never an error


class Outcome(StrEnum):
    """The `reason` labels that are not a `Reason`: what became of a miss, or why the request ended early.

    The other reasons are a `Reason`, a tier name (`l1`, `l2`) on hits, or an upstream error code on stale answers.
    """

    STORED = "stored"  # the answer was stored
    NOT_STORED = "not-stored"  # not stored, and no rule refused it (a stream flight's value until it ends)
    STREAM = "stream"  # `stream: true` on embeddings (not an OpenAI feature): relayed untouched
    ABANDONED = "abandoned"  # every subscriber of a stream left: the stream was cancelled, nothing stored
    LEASE_REPLAY = "lease-replay"  # a stream flight replayed the entry another replica stored under its lease
    CLIENT_GONE = "client_gone"  # the client left before the handler knew more
    FAILED = "error"  # a GatewayError (rendered as OpenAI error JSON) before any answer


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    enabled: bool = True
    ttl_s: int = 3600
    allow_seeded: bool = False
    allow_n_gt_1: bool = False
    stale_if_error_s: int = 0

    def __post_init__(self) -> None:
        if self.ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {self.ttl_s}")
        if self.stale_if_error_s < 0:
            raise ValueError(f"stale_if_error_s must not be negative, got {self.stale_if_error_s}")


@dataclass(frozen=True, slots=True)
class Lookup:
    """Cacheable: look up unless `read` is False (no-cache), and store the answer with `ttl_s`.

    `needs_usage`: the answer carries usage (every JSON answer; a stream only with `include_usage`), so an entry
    without it cannot answer this request (`lacks`).
    `seeded`: a seeded sampled request, cacheable only once the upstream's promise is known (`confirm_seeded`).
    """

    ttl_s: int
    read: bool
    max_age_s: int | None
    only_if_cached: bool
    needs_usage: bool = True
    seeded: bool = False


@dataclass(frozen=True, slots=True)
class Bypass:
    """Not cacheable: forward, and store nothing."""

    reason: Reason


class Freshness(StrEnum):
    FRESH = "fresh"
    STALE = "stale"  # past its TTL but inside stale_if_error_s: usable only when the upstream fails
    EXPIRED = "expired"


def decide(
    endpoint: str, body: Mapping[str, Any], directives: RequestDirectives, route: RoutePolicy
) -> Lookup | Bypass:
    """Lookup or Bypass for a request; `body` is the client's (or the canonical) request."""
    if endpoint not in CACHEABLE_ENDPOINTS:
        return Bypass(Reason.ENDPOINT)
    if not route.enabled:
        return Bypass(Reason.ROUTE_OFF)
    if directives.no_store:
        # RFC 9111 §5.2.1.5 only forbids storing; design §4 also skips the lookup ("neither").
        return Bypass(Reason.NO_STORE)
    reason = _responses_reason(body) if endpoint == RESPONSES else _live_reason(endpoint, body)
    if reason is None and endpoint != "embeddings":
        reason = _remote_reason(
            body.get(TEXT_FIELDS[endpoint])
        )  # the endpoint's input: messages, prompt, items
    if reason is not None:
        return Bypass(reason)
    seeded = False
    if endpoint not in _DETERMINISTIC_ENDPOINTS:
        sampling = _sampling(body, route)
        if isinstance(sampling, Reason):
            return Bypass(sampling)
        seeded = sampling
    return Lookup(
        ttl_s=route.ttl_s,
        # RFC 9111 §5.2.1.4: no-cache forbids answering from a stored response; the new one may be stored.
        read=not directives.no_cache,
        # RFC 9111 §5.2.1.1 (checked by `satisfies`) and §5.2.1.7 (504 on a miss, in the handler).
        max_age_s=directives.max_age_s,
        only_if_cached=directives.only_if_cached,
        # a Responses stream always ends with the whole response, usage included
        needs_usage=endpoint in USAGE_ENDPOINTS
        and (endpoint == RESPONSES or body.get("stream") is not True or wants_usage(body)),
        seeded=seeded,
    )


def confirm_seeded(lookup: Lookup, *, promised: bool) -> Lookup | Bypass:
    """A seeded sampled request is deterministic only on an engine whose seeded sampling is batch-invariant.

    `promised`: the upstream says so for the model (`tokenedge.seeded_invariant` in `/v1/models`). Elsewhere the
    same seed can draw other tokens when the batch differs (vLLM's default kernels), so caching it would freeze one
    draw and serve it as if it were the answer: a bypass, unless the route opted in (`allow_seeded`, decided in
    `decide`, where `seeded` is then False).
    """
    if not lookup.seeded or promised:
        return lookup
    return Bypass(Reason.SEED)


def _responses_reason(body: Mapping[str, Any]) -> Reason | None:
    """A Responses request is cacheable only when stateless: the upstream neither keeps the answer (a cached hit
    would hand out a response id nothing can retrieve) nor continues a conversation it holds (the input the model
    sees is not in the request), and no tool the upstream runs itself feeds the answer."""
    if body.get("store") is not False:  # OpenAI's default is store: true
        return Reason.STATEFUL
    if any(body.get(name) is not None for name in ("previous_response_id", "conversation", "prompt")):
        return Reason.STATEFUL  # `prompt`: a stored prompt template, which its owner may edit
    if body.get("background") is True:
        return Reason.STATEFUL
    tools = body.get("tools")
    if isinstance(tools, list) and any(
        not isinstance(t, dict) or t.get("type") not in _CLIENT_TOOLS for t in tools
    ):
        return Reason.HOSTED_TOOL
    return None


def _live_reason(endpoint: str, body: Mapping[str, Any]) -> Reason | None:
    """Chat and completions inputs that make the answer follow the world or a draw, not the request."""
    if endpoint == "chat/completions":
        if body.get("store") is True:  # a stored completion: the upstream keeps it (retrievable, listable)
            return Reason.STATEFUL
        if body.get("web_search_options") is not None:  # live search results
            return Reason.HOSTED_TOOL
    # llama.cpp: XTC removes top tokens by a random draw and dynamic temperature rescales around the temperature
    # step, both before a greedy pick; mirostat samples whatever the temperature.
    for name in _DRAWING_SAMPLERS:
        value = body.get(name)
        if value is not None and value is not False and value != 0:
            return Reason.SAMPLER
    return None


def _remote_reason(value: Any, depth: int = 0) -> Reason | None:
    """An input part that names mutable content instead of carrying it: an http(s) `image_url`/`file_url`/
    `audio_url`, a `file_id`, a Responses `item_reference`. The same request can then get another answer once
    the content behind the reference changes, so it is not cached. `data:` URLs carry their content: cacheable."""
    if depth > 8:
        return None
    if isinstance(value, list):
        for item in value:
            reason = _remote_reason(item, depth + 1)
            if reason is not None:
                return reason
        return None
    if not isinstance(value, Mapping):
        return None
    if value.get("type") == "item_reference" or value.get("file_id") is not None:
        return Reason.REMOTE_INPUT
    for name, item in value.items():
        if name.endswith("_url"):
            url = item.get("url") if isinstance(item, Mapping) else item
            if isinstance(url, str) and not url.startswith("data:"):
                return Reason.REMOTE_INPUT
        elif isinstance(item, list | Mapping):
            reason = _remote_reason(item, depth + 1)
            if reason is not None:
                return reason
    return None


def wants_usage(body: Mapping[str, Any]) -> bool:
    """A streamed request that asked for the closing usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def lacks(
    usage: Mapping[str, Any] | None, *, needs_usage: bool, stream_only: bool = False, needs_json: bool = False
) -> Reason | None:
    """Why an entry cannot answer a request, or None: a hit is the whole answer, never a partial one (design §4).

    An entry without usage (a plain stream from an upstream that ignores `stream_options`, or an older gateway's)
    answers every plain stream but is a miss for any request whose answer carries usage; an entry with no JSON
    form (`stream_only`) answers streams only. The miss says why in `Cache-Status` and in a metric.
    """
    if needs_json and stream_only:
        return Reason.STREAM_ONLY
    if needs_usage and usage is None:
        return Reason.NO_USAGE
    return None


def _sampling(body: Mapping[str, Any], route: RoutePolicy) -> Reason | bool:
    """Why a generation request is random (a Reason), or whether it is cacheable only on the upstream's promise
    of invariant seeded sampling (True: seeded and sampled, the route not opted in). A value of the wrong type
    counts as random."""
    temperature = _number(body.get("temperature"), default=1)
    seeded = False
    if temperature != 0:
        if _number(body.get("seed"), default=None) is None:
            return Reason.TEMPERATURE
        seeded = not route.allow_seeded
    n = _number(body.get("n"), default=1)
    if n is None or (n != 1 and not route.allow_n_gt_1):
        return Reason.N
    return seeded


def _number(value: Any, *, default: float | None) -> float | None:
    """The value as a number: `default` when absent or null, None when it is not a number."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


# One rule for what is an error, for every endpoint: the member each 200 answer must hold.
PAYLOADS = {
    "chat/completions": "choices",
    "completions": "choices",
    "embeddings": "data",
    RESPONSES: "output",
}


def error_body(endpoint: str, doc: Mapping[str, Any]) -> bool:
    """Whether a 200 JSON answer is an error: an `error` member that is not null (some providers report errors
    found after processing started this way), or no list under the endpoint's payload (`PAYLOADS`). Never stored.
    A stream chunk is judged by its `error` member alone (`gateway.misses.streaming.recorder`)."""
    payload = PAYLOADS.get(endpoint)
    return doc.get("error") is not None or (payload is not None and not isinstance(doc.get(payload), list))


def store_refusal(
    *,
    status: int,
    body_bytes: int,
    max_entry_bytes: int,
    complete: bool,
    finish_reasons: Iterable[str | None],
    has_usage: bool,
    streamed: bool = False,
    error: bool = False,
) -> Reason | None:
    """Why a response may not be stored, or None when it may: only complete, clean HTTP 200 answers.

    `error`: the body is an error (`error_body`). `finish_reasons` are the choices' final finish reasons; None
    entries (a chunk without one) are ignored, since completeness is `complete`'s job (a non-stream body, or a
    stream that saw [DONE]). `has_usage`: a JSON generation without usage is relayed but not stored (every request
    it could answer as JSON needs usage; callers pass True outside `USAGE_ENDPOINTS`); a `streamed` one is stored,
    since it answers every plain stream, and `lacks` turns away the requests that need usage.
    """
    if status != 200:  # never errors, 429s, redirects or partial content
        return Reason.STATUS
    if error:
        return Reason.ERROR
    if not complete:
        return Reason.INCOMPLETE
    reasons = {reason for reason in finish_reasons if reason is not None}
    if "content_filter" in reasons:
        return Reason.CONTENT_FILTER
    if "error" in reasons:
        return Reason.ERROR
    if "abort" in reasons:  # vLLM's finish reason for an aborted request
        return Reason.INCOMPLETE
    if not has_usage and not streamed:
        return Reason.NO_USAGE
    if body_bytes > max_entry_bytes:
        return Reason.TOO_LARGE
    return None


def freshness(*, age_s: float, ttl_s: int, stale_if_error_s: int) -> Freshness:
    """RFC 9111 §4.2: fresh while age < lifetime; RFC 5861 §4: then stale-if-error for N more seconds."""
    age_s = max(age_s, 0.0)  # RFC 9111 §4.2.3 keeps ages non-negative (clock skew)
    if age_s < ttl_s:
        return Freshness.FRESH
    if age_s < ttl_s + stale_if_error_s:
        return Freshness.STALE
    return Freshness.EXPIRED


def satisfies(*, age_s: float, directives: RequestDirectives) -> bool:
    """RFC 9111 §5.2.1.1: with max-age=N the client accepts only a response whose age is <= N seconds."""
    return directives.max_age_s is None or age_s <= directives.max_age_s
