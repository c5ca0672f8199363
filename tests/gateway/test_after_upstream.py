"""Tests for gateway/misses/answer.py: the pure decision about the upstream's answer, shared by JSON fills and streams,
and the labels of a served miss."""

from __future__ import annotations

import pytest

from gateway.keys.entry import Entry
from gateway.keys.policy import Outcome, Reason, Result
from gateway.misses.answer import AskAgain, Decision, Serve, ServeStale, after_upstream, miss_reason

MISS, COALESCED = Serve(Result.MISS), Serve(Result.COALESCED)

# (name, status, error code, leader, public scope, stale entry at hand, decision)
DECISIONS: list[tuple[str, int | None, str, bool, bool, bool, Decision]] = [
    ("200, leader", 200, "", True, False, False, MISS),
    ("200, follower", 200, "", False, False, False, COALESCED),
    ("200 with a stale entry is still the answer", 200, "", True, True, True, MISS),
    ("404 passes through", 404, "", True, False, True, MISS),
    ("499 is not a server error", 499, "", True, False, True, MISS),
    ("500 with a stale entry", 500, "", True, False, True, ServeStale("status-500", Reason.STATUS)),
    ("503 follower with a stale entry", 503, "", False, False, True, ServeStale("status-503", "status")),
    ("502 without a stale entry", 502, "", True, False, False, MISS),
    ("502 follower without a stale entry", 502, "", False, True, False, COALESCED),
    (
        "refused, stale at hand",
        None,
        "upstream_unreachable",
        True,
        False,
        True,
        ServeStale("upstream_unreachable", "upstream_unreachable"),
    ),
    (
        "timeout, follower, stale at hand",
        None,
        "timeout",
        False,
        True,
        True,
        ServeStale("timeout", "timeout"),
    ),
    ("failure without a code", None, "", True, False, True, ServeStale("error", "error")),
    ("failure without a stale entry propagates", None, "timeout", True, False, False, MISS),
    ("failure, follower, no stale", None, "timeout", False, True, False, COALESCED),
    ("401 follower on a public route asks again", 401, "", False, True, False, AskAgain()),
    ("403 follower on a public route asks again", 403, "", False, True, True, AskAgain()),
    ("429 follower on a public route asks again", 429, "", False, True, False, AskAgain()),
    ("401 leader on a public route is its own refusal", 401, "", True, True, False, MISS),
    ("401 follower on a tenant route shares the caller", 401, "", False, False, False, COALESCED),
    ("400 follower on a public route is about the request", 400, "", False, True, False, COALESCED),
]


@pytest.mark.parametrize(
    ("status", "code", "leader", "public", "stale", "expected"),
    [row[1:] for row in DECISIONS],
    ids=[row[0] for row in DECISIONS],
)
def test_after_upstream(
    status: int | None, code: str, leader: bool, public: bool, stale: bool, expected: Decision
) -> None:
    decision = after_upstream(status, leader=leader, public_scope=public, has_stale=stale, error_code=code)
    assert decision == expected


def test_a_credential_refusal_asked_again_as_leader_is_served() -> None:
    assert after_upstream(401, leader=True, public_scope=True, has_stale=True) == MISS


def test_a_server_error_asked_again_falls_back_to_stale() -> None:
    assert after_upstream(500, leader=True, public_scope=True, has_stale=True) == ServeStale(
        "status-500", "status"
    )


def _entry() -> Entry:
    return Entry("te1:pub:ab", "completions", b"{}", "m", "r", 0.0, 60, 0, '"e"', ())


@pytest.mark.parametrize(
    ("stored", "refusal", "label"),
    [
        (True, None, "stored"),
        (False, Reason.TOO_LARGE, "too-large"),
        (False, Reason.STATUS, "status"),
        (False, None, "not-stored"),
    ],
)
def test_miss_reason_labels(stored: bool, refusal: Reason | None, label: str) -> None:
    reason = miss_reason(_entry() if stored else None, refusal)
    assert reason == label and str(reason) == label


def test_label_enums_render_as_their_values() -> None:
    """Metric labels and Cache-Status details are the enum values, byte for byte (f-strings, str(), joins)."""
    assert [str(r) for r in Result] == ["hit", "miss", "coalesced", "stale", "bypass", "error", "client_gone"]
    assert f"{Outcome.STREAM}" == "stream" and ".".join([Outcome.ABANDONED, "exact"]) == "abandoned.exact"
    assert {o.value for o in Outcome} == {
        "stored",
        "not-stored",
        "stream",
        "abandoned",
        "lease-replay",
        "client_gone",
        "error",
    }
