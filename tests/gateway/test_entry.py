"""Entry serialization: round trip, and anything unknown or damaged reads as a miss."""

from __future__ import annotations

import pytest

from gateway.keys.entry import ENTRY_FORMAT, Entry, decode, encode, make_etag


def entry(**overrides: object) -> Entry:
    body = b'{"id":"x","choices":[]}'
    fields: dict[str, object] = dict(
        key="te1:pub:" + "a" * 64,
        endpoint="chat/completions",
        body=body,
        model="m",
        revision="r",
        created_at=1000.5,
        ttl_s=60,
        stale_if_error_s=30,
        etag=make_etag(body),
        tags=("model:m", "rev:r", "tenant:pub", "key:" + "a" * 64),
        usage={"total_tokens": 3},
        stream_chunks=(b'{"a":1}', b'{"b":2}'),
    )
    fields.update(overrides)
    return Entry(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("chunks", [None, (), (b'{"x":"\\u00e9"}',)])
def test_round_trip(chunks: tuple[bytes, ...] | None) -> None:
    original = entry(stream_chunks=chunks)
    assert decode(encode(original)) == original


def test_unknown_format_version_is_a_miss() -> None:
    raw = bytearray(encode(entry()))
    raw[2] = ENTRY_FORMAT + 1
    assert decode(bytes(raw)) is None


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"TE",
        b"XX\x01\x00\x00\x00\x02{}",
        b"TE\x01\x00\x00\x10\x00{}",
        b"TE\x01\x00\x00\x00\x02{}",
        b"TE\x01\x00\x00\x00\x04null",
    ],
)
def test_damaged_values_are_misses(raw: bytes) -> None:
    assert decode(raw) is None


def test_etag_is_strong_and_depends_on_the_body() -> None:
    assert make_etag(b"a").startswith('"') and make_etag(b"a").endswith('"')
    assert make_etag(b"a") != make_etag(b"b")


def test_expiry_includes_the_stale_window() -> None:
    assert entry().expires_at() == 1000.5 + 60 + 30


@pytest.mark.parametrize("usage", [None, {"total_tokens": 3}])
def test_a_stream_only_or_usage_less_entry_round_trips(usage: dict[str, int] | None) -> None:
    original = entry(body=b"", stream_only=True, usage=usage)
    decoded = decode(encode(original))
    assert decoded == original and decoded is not None and decoded.stream_only


def test_an_entry_of_the_previous_format_is_a_miss() -> None:
    """Format 1 kept only some fields of a streamed answer and had no `stream_only`: read as a miss, refilled."""
    raw = bytearray(encode(entry()))
    raw[2] = 1
    assert ENTRY_FORMAT == 2 and decode(bytes(raw)) is None
