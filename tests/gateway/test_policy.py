"""Tests for gateway/keys/policy.py: lookup or bypass, what may be stored, freshness and max-age."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.keys.cache_control import RequestDirectives
from gateway.keys.policy import (
    Bypass,
    Freshness,
    Lookup,
    Reason,
    RoutePolicy,
    confirm_seeded,
    decide,
    freshness,
    lacks,
    satisfies,
    store_refusal,
)

CHAT = "chat/completions"
ROUTE = RoutePolicy(ttl_s=600)
NONE = RequestDirectives()
HIT = Lookup(ttl_s=600, read=True, max_age_s=None, only_if_cached=False)
SEEDED = Lookup(ttl_s=600, read=True, max_age_s=None, only_if_cached=False, seeded=True)
EMBED = Lookup(ttl_s=600, read=True, max_age_s=None, only_if_cached=False, needs_usage=False)


def msgs(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


DECISIONS = [
    ("temperature 0", CHAT, msgs(temperature=0), NONE, ROUTE, HIT),
    ("temperature 0.0", CHAT, msgs(temperature=0.0), NONE, ROUTE, HIT),
    ("temperature 0.7", CHAT, msgs(temperature=0.7), NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("temperature absent is 1", CHAT, msgs(), NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("temperature null is 1", CHAT, msgs(temperature=None), NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("temperature 1", CHAT, msgs(temperature=1), NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("temperature a string", CHAT, msgs(temperature="0"), NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("temperature false is not 0", CHAT, msgs(temperature=False), NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("temperature a list", CHAT, msgs(temperature=[0]), NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("seeded: on the upstream's promise", CHAT, msgs(temperature=0.7, seed=42), NONE, ROUTE, SEEDED),
    (
        "seeded, route allows",
        CHAT,
        msgs(temperature=0.7, seed=42),
        NONE,
        RoutePolicy(ttl_s=600, allow_seeded=True),
        HIT,
    ),
    (
        "seeded at default temperature, route allows",
        CHAT,
        msgs(seed=0),
        NONE,
        RoutePolicy(ttl_s=600, allow_seeded=True),
        HIT,
    ),
    (
        "seed null is no seed",
        CHAT,
        msgs(temperature=0.7, seed=None),
        NONE,
        RoutePolicy(allow_seeded=True),
        Bypass(Reason.TEMPERATURE),
    ),
    (
        "seed a string is no seed",
        CHAT,
        msgs(temperature=0.7, seed="1"),
        NONE,
        RoutePolicy(allow_seeded=True),
        Bypass(Reason.TEMPERATURE),
    ),
    ("seed with temperature 0, route disallows", CHAT, msgs(temperature=0, seed=1), NONE, ROUTE, HIT),
    ("n 2", CHAT, msgs(temperature=0, n=2), NONE, ROUTE, Bypass(Reason.N)),
    (
        "n 2, route allows",
        CHAT,
        msgs(temperature=0, n=2),
        NONE,
        RoutePolicy(ttl_s=600, allow_n_gt_1=True),
        HIT,
    ),
    ("n 1", CHAT, msgs(temperature=0, n=1), NONE, ROUTE, HIT),
    ("n 1.0", CHAT, msgs(temperature=0, n=1.0), NONE, ROUTE, HIT),
    ("n null", CHAT, msgs(temperature=0, n=None), NONE, ROUTE, HIT),
    (
        "n a string",
        CHAT,
        msgs(temperature=0, n="1"),
        NONE,
        RoutePolicy(ttl_s=600, allow_n_gt_1=True),
        Bypass(Reason.N),
    ),
    ("completions temperature 0", "completions", {"prompt": "a", "temperature": 0}, NONE, ROUTE, HIT),
    ("completions sampled", "completions", {"prompt": "a"}, NONE, ROUTE, Bypass(Reason.TEMPERATURE)),
    ("embeddings, no temperature", "embeddings", {"input": "a"}, NONE, ROUTE, EMBED),
    ("embeddings, any temperature", "embeddings", {"input": "a", "temperature": 0.9}, NONE, ROUTE, EMBED),
    ("embeddings, n ignored", "embeddings", {"input": "a", "n": 3}, NONE, ROUTE, EMBED),
    ("uncacheable endpoint", "images/generations", msgs(temperature=0), NONE, ROUTE, Bypass(Reason.ENDPOINT)),
    ("route off", CHAT, msgs(temperature=0), NONE, RoutePolicy(enabled=False), Bypass(Reason.ROUTE_OFF)),
    (
        "route off wins over sampling",
        CHAT,
        msgs(),
        NONE,
        RoutePolicy(enabled=False),
        Bypass(Reason.ROUTE_OFF),
    ),
    ("no-store", CHAT, msgs(temperature=0), RequestDirectives(no_store=True), ROUTE, Bypass(Reason.NO_STORE)),
    (
        "no-store on embeddings",
        "embeddings",
        {"input": "a"},
        RequestDirectives(no_store=True),
        ROUTE,
        Bypass(Reason.NO_STORE),
    ),
    (
        "no-cache skips the read only",
        CHAT,
        msgs(temperature=0),
        RequestDirectives(no_cache=True),
        ROUTE,
        Lookup(ttl_s=600, read=False, max_age_s=None, only_if_cached=False),
    ),
    (
        "max-age propagates",
        CHAT,
        msgs(temperature=0),
        RequestDirectives(max_age_s=30),
        ROUTE,
        Lookup(ttl_s=600, read=True, max_age_s=30, only_if_cached=False),
    ),
    (
        "only-if-cached propagates",
        CHAT,
        msgs(temperature=0),
        RequestDirectives(only_if_cached=True),
        ROUTE,
        Lookup(ttl_s=600, read=True, max_age_s=None, only_if_cached=True),
    ),
    ("route ttl used", CHAT, msgs(temperature=0), NONE, RoutePolicy(ttl_s=5), Lookup(5, True, None, False)),
]


@pytest.mark.parametrize(
    ("endpoint", "body", "directives", "route", "expected"),
    [c[1:] for c in DECISIONS],
    ids=[c[0] for c in DECISIONS],
)
def test_decide(
    endpoint: str,
    body: dict[str, Any],
    directives: RequestDirectives,
    route: RoutePolicy,
    expected: Lookup | Bypass,
) -> None:
    assert decide(endpoint, body, directives, route) == expected


def test_decide_does_not_mutate_the_body() -> None:
    body = msgs(temperature=0)
    decide(CHAT, body, NONE, ROUTE)
    assert body == msgs(temperature=0)


def test_reasons_are_short_lowercase_header_tokens() -> None:
    for reason in Reason:
        assert reason.value.islower() and reason.value.replace("-", "").isalpha()
    assert len({r.value for r in Reason}) == len(Reason)


@pytest.mark.parametrize(("field", "value"), [("ttl_s", 0), ("stale_if_error_s", -1)])
def test_route_policy_validates_itself(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        RoutePolicy(**{field: value})


CONFIRM = [
    ("seeded, promised", SEEDED, True, SEEDED),
    ("seeded, not promised", SEEDED, False, Bypass(Reason.SEED)),
    ("greedy needs no promise", HIT, False, HIT),
    ("route opted in: no promise needed", HIT, False, HIT),
]


@pytest.mark.parametrize(
    ("lookup", "promised", "expected"), [c[1:] for c in CONFIRM], ids=[c[0] for c in CONFIRM]
)
def test_seeded_requests_are_cached_only_on_the_upstreams_promise(
    lookup: Lookup, promised: bool, expected: Lookup | Bypass
) -> None:
    assert confirm_seeded(lookup, promised=promised) == expected


def test_a_route_that_opts_in_caches_seeded_requests_without_the_promise() -> None:
    decision = decide(CHAT, msgs(temperature=0.7, seed=1), NONE, RoutePolicy(ttl_s=600, allow_seeded=True))
    assert decision == HIT and confirm_seeded(decision, promised=False) == HIT


# --- store_refusal ---------------------------------------------------------------------------------------

CAP = 1000
STORE = [
    ("200 complete", 200, 500, True, ["stop"], None),
    ("finish by length is a complete answer", 200, 500, True, ["length"], None),
    ("tool calls", 200, 500, True, ["tool_calls"], None),
    ("embeddings have no finish reasons", 200, 500, True, [], None),
    ("null finish reasons ignored", 200, 500, True, [None, None, "stop"], None),
    ("exactly at the cap", 200, CAP, True, ["stop"], None),
    ("429", 429, 100, True, [], Reason.STATUS),
    ("500", 500, 100, True, [], Reason.STATUS),
    ("503", 503, 100, True, [], Reason.STATUS),
    ("201 is not 200", 201, 100, True, ["stop"], Reason.STATUS),
    ("206 partial", 206, 100, True, ["stop"], Reason.STATUS),
    ("304", 304, 0, True, [], Reason.STATUS),
    ("content filter", 200, 500, True, ["stop", "content_filter"], Reason.CONTENT_FILTER),
    ("error finish reason", 200, 500, True, ["error"], Reason.ERROR),
    ("aborted choice", 200, 500, True, ["abort"], Reason.INCOMPLETE),
    ("too large", 200, CAP + 1, True, ["stop"], Reason.TOO_LARGE),
    ("incomplete stream", 200, 500, False, ["stop"], Reason.INCOMPLETE),
    ("status checked first", 500, CAP + 1, False, ["content_filter"], Reason.STATUS),
]


@pytest.mark.parametrize(
    ("status", "size", "complete", "finish", "expected"), [c[1:] for c in STORE], ids=[c[0] for c in STORE]
)
def test_store_refusal(
    status: int, size: int, complete: bool, finish: list[str | None], expected: Reason | None
) -> None:
    refusal = store_refusal(
        status=status,
        body_bytes=size,
        max_entry_bytes=CAP,
        complete=complete,
        finish_reasons=finish,
        has_usage=True,
    )
    assert refusal == expected


def test_an_answer_without_usage_is_not_stored() -> None:
    """design §4: a later JSON hit (or streamed hit with include_usage) would lack it: relayed, never stored."""
    refusal = store_refusal(
        status=200,
        body_bytes=10,
        max_entry_bytes=CAP,
        complete=True,
        finish_reasons=["stop"],
        has_usage=False,
    )
    assert refusal is Reason.NO_USAGE


NEEDS_USAGE = [
    ("JSON", msgs(temperature=0), True),
    ("JSON with stream false", msgs(temperature=0, stream=False), True),
    ("plain stream", msgs(temperature=0, stream=True), False),
    (
        "stream with include_usage",
        msgs(temperature=0, stream=True, stream_options={"include_usage": True}),
        True,
    ),
    ("include_usage false", msgs(temperature=0, stream=True, stream_options={"include_usage": False}), False),
    (
        "include_usage not a bool",
        msgs(temperature=0, stream=True, stream_options={"include_usage": 1}),
        False,
    ),
]


def test_an_embeddings_entry_needs_no_usage() -> None:
    """Its JSON is the upstream's own, the whole of what any later request gets: no stream form asks for more."""
    decision = decide("embeddings", {"model": "m", "input": "a"}, NONE, ROUTE)
    assert isinstance(decision, Lookup) and not decision.needs_usage


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in NEEDS_USAGE], ids=[c[0] for c in NEEDS_USAGE])
def test_what_answers_carry_usage(body: dict[str, Any], expected: bool) -> None:
    decision = decide(CHAT, body, NONE, ROUTE)
    assert isinstance(decision, Lookup) and decision.needs_usage is expected


LACKS = [
    ("whole entry, JSON request", {"total_tokens": 3}, True, None),
    ("no usage, JSON request", None, True, Reason.NO_USAGE),
    ("no usage, plain stream", None, False, None),
    ("whole entry, plain stream", {"total_tokens": 3}, False, None),
]


@pytest.mark.parametrize(("usage", "needs", "expected"), [c[1:] for c in LACKS], ids=[c[0] for c in LACKS])
def test_an_entry_missing_what_a_request_needs_is_a_miss(
    usage: dict[str, Any] | None, needs: bool, expected: Reason | None
) -> None:
    assert lacks(usage, needs_usage=needs) == expected


def test_store_refusal_accepts_a_generator() -> None:
    reasons = (r for r in ["stop", "content_filter"])
    assert store_refusal(
        status=200, body_bytes=1, max_entry_bytes=CAP, complete=True, finish_reasons=reasons, has_usage=True
    ) == (Reason.CONTENT_FILTER)


# --- freshness and max-age -------------------------------------------------------------------------------

FRESHNESS = [
    ("new", 0.0, 60, 30, Freshness.FRESH),
    ("just before ttl", 59.999, 60, 30, Freshness.FRESH),
    ("at ttl", 60.0, 60, 30, Freshness.STALE),
    ("inside stale window", 75.0, 60, 30, Freshness.STALE),
    ("just before end of stale window", 89.999, 60, 30, Freshness.STALE),
    ("at end of stale window", 90.0, 60, 30, Freshness.EXPIRED),
    ("long expired", 10_000.0, 60, 30, Freshness.EXPIRED),
    ("no stale window", 60.0, 60, 0, Freshness.EXPIRED),
    ("negative age from clock skew", -5.0, 60, 0, Freshness.FRESH),
]


@pytest.mark.parametrize(
    ("age", "ttl", "sie", "expected"), [c[1:] for c in FRESHNESS], ids=[c[0] for c in FRESHNESS]
)
def test_freshness_boundaries(age: float, ttl: int, sie: int, expected: Freshness) -> None:
    assert freshness(age_s=age, ttl_s=ttl, stale_if_error_s=sie) == expected


SATISFIES = [
    ("no max-age", 1e9, None, True),
    ("younger than max-age", 5.0, 10, True),
    ("exactly max-age", 10.0, 10, True),
    ("older than max-age", 10.5, 10, False),
    ("max-age 0 accepts only age 0", 0.0, 0, True),
    ("max-age 0 refuses any age", 0.1, 0, False),
]


@pytest.mark.parametrize(
    ("age", "max_age", "expected"), [c[1:] for c in SATISFIES], ids=[c[0] for c in SATISFIES]
)
def test_satisfies_max_age(age: float, max_age: int | None, expected: bool) -> None:
    assert satisfies(age_s=age, directives=RequestDirectives(max_age_s=max_age)) is expected
