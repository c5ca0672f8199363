"""The request memo: an exact, byte-bounded LRU over raw request bytes (gateway/memo.py)."""

from __future__ import annotations

from gateway.memo import MAX_MEMO_BODY_BYTES, ParsedRequest, RequestMemo


def parsed(size: int) -> ParsedRequest:
    return ParsedRequest({"model": "m"}, size=size)


def test_get_returns_only_the_exact_bytes_of_the_same_endpoint() -> None:
    memo = RequestMemo(1000)
    memo.put("chat/completions", b'{"a":1}', first := parsed(100))
    assert memo.get("chat/completions", b'{"a":1}') is first
    assert memo.get("chat/completions", b'{"a": 1}') is None
    assert memo.get("completions", b'{"a":1}') is None


def test_the_least_recently_used_entry_leaves_first_when_over_budget() -> None:
    memo = RequestMemo(300)
    for name in (b"a", b"b", b"c"):
        memo.put("e", name, parsed(100))
    assert memo.get("e", b"a") is not None  # now a is the most recent: b is the oldest
    memo.put("e", b"d", parsed(100))
    assert memo.get("e", b"b") is None
    assert all(memo.get("e", name) is not None for name in (b"a", b"c", b"d"))
    assert memo.size == 300


def test_replacing_an_entry_does_not_count_it_twice() -> None:
    memo = RequestMemo(300)
    memo.put("e", b"a", parsed(200))
    memo.put("e", b"a", parsed(100))
    assert memo.size == 100


def test_oversized_bodies_and_entries_and_a_zero_budget_are_not_kept() -> None:
    memo = RequestMemo(300)
    memo.put("e", b"x" * (MAX_MEMO_BODY_BYTES + 1), parsed(10))
    memo.put("e", b"big", parsed(301))
    assert memo.get("e", b"big") is None and memo.size == 0
    off = RequestMemo(0)
    off.put("e", b"a", parsed(1))
    assert off.get("e", b"a") is None and not off.enabled
