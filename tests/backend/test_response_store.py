"""backend/server/response_store.py: a bounded LRU by count and by bytes; a response over the byte bound alone
is not kept."""

from __future__ import annotations

import pytest

from backend.server.response_store import ResponseStore, StoreLimits


def response(response_id: str, text: str = "x") -> dict[str, str]:
    return {"id": response_id, "text": text}


def test_the_least_recently_used_goes_first_past_the_count() -> None:
    store = ResponseStore(StoreLimits(max_count=2))
    store.put(response("a"), [])
    store.put(response("b"), [])
    assert store.get("a") is not None  # a is now more recent than b
    store.put(response("c"), [])
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert len(store) == 2


def test_bytes_are_bounded_and_accounted() -> None:
    one = ResponseStore(StoreLimits(max_bytes=10**6))
    one.put(response("a", "y" * 100), [{"role": "user", "content": "hi"}])
    size = one.size_bytes
    store = ResponseStore(StoreLimits(max_bytes=2 * size + 1))
    for name in ("a", "b", "c"):
        store.put(response(name, "y" * 100), [{"role": "user", "content": "hi"}])
    assert store.get("a") is None and len(store) == 2 and store.size_bytes == 2 * size
    assert store.delete("b") and not store.delete("b") and store.size_bytes == size


def test_a_response_too_big_alone_is_not_kept() -> None:
    store = ResponseStore(StoreLimits(max_bytes=50))
    assert not store.put(response("a", "y" * 100), [])
    assert store.get("a") is None and store.size_bytes == 0


def test_putting_the_same_id_replaces_it() -> None:
    store = ResponseStore(StoreLimits())
    store.put(response("a", "one"), [])
    store.put(response("a", "two"), [])
    entry = store.get("a")
    assert len(store) == 1 and entry is not None and entry.response["text"] == "two"


def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        StoreLimits(max_count=0)
