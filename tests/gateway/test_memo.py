"""The request memo: exact on the bytes and the endpoint, and bounded by the memory it really holds."""

from __future__ import annotations

import orjson

from gateway.keys.canonical import Level, canonical_json, canonicalize
from gateway.keys.derive import derive_key_from_bytes
from gateway.keys.memo import ParsedRequest, RequestMemo
from tests.gateway.test_memory_tier import traced_growth

CHAT = "chat/completions"


def remember(memo: RequestMemo, i: int) -> ParsedRequest:
    """What the handler does for new bytes: parse, store, then canonical bytes and a key on the first lookup."""
    raw = memoryview(
        orjson.dumps(
            {
                "model": "test-model",
                "temperature": 0,
                "messages": [{"role": "user", "content": f"What is {i} + {i}? Answer in one word."}],
            }
        )
    ).tobytes()  # exact, as aiohttp
    parsed = ParsedRequest(CHAT, orjson.loads(raw))
    memo.put(CHAT, raw, parsed)
    memo.set_canonical(parsed, canonical_json(canonicalize(CHAT, parsed.body, Level.EXACT)), Level.EXACT, "")
    assert parsed.canonical is not None
    key = derive_key_from_bytes(
        scope="t0123456789abcdef",
        endpoint=CHAT,
        level=Level.EXACT,
        model_revision="rev-1",
        canonical_bytes=parsed.canonical,
    )
    wire = f"h-accept-{i}".encode()  # each request's own key-material bytes
    memo.set_key(parsed, key, Level.EXACT, ("t0123456789abcdef", "rev-1", "", wire))
    return parsed


def test_the_budget_counts_what_the_records_really_hold() -> None:
    def fill() -> RequestMemo:
        memo = RequestMemo(1 << 40)
        for i in range(1_500):
            remember(memo, i)
        return memo

    traced, memo = traced_growth(fill)
    assert isinstance(memo, RequestMemo) and memo.entries() == 1_500
    assert traced <= memo.bytes_used() <= 1.4 * traced, (traced, memo.bytes_used())


def test_memory_stays_within_the_budget_with_many_unique_requests() -> None:
    budget = 128 * 1024

    def fill() -> RequestMemo:
        memo = RequestMemo(budget)
        for i in range(2_000):
            remember(memo, i)
        return memo

    traced, memo = traced_growth(fill)
    assert isinstance(memo, RequestMemo) and 0 < memo.entries() < 2_000
    assert memo.bytes_used() <= budget
    assert traced <= budget * 1.15


def test_same_bytes_on_another_endpoint_is_a_miss() -> None:
    memo = RequestMemo(1 << 20)
    parsed = remember(memo, 1)
    raw = next(iter(memo._records))
    assert memo.get(CHAT, raw) is parsed
    assert memo.get("completions", raw) is None


def test_growth_after_insertion_is_charged() -> None:
    memo = RequestMemo(1 << 20)
    raw = b'{"model":"m","prompt":"hi"}'
    parsed = ParsedRequest("completions", orjson.loads(raw))
    memo.put("completions", raw, parsed)
    before = memo.bytes_used()
    memo.set_canonical(parsed, b"x" * 1000, Level.EXACT, "")
    assert memo.bytes_used() >= before + 1000
    assert memo.bytes_used() == parsed.size
