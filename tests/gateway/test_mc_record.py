"""The Memcached record: round trip, unknown versions read as misses, counters, and tag-version validation."""

from __future__ import annotations

import struct

import pytest

from gateway.keys.derive import entry_tags
from gateway.keys.entry import Entry, encode, make_etag
from gateway.tiers.mc_record import (
    ITEM_OVERHEAD_BYTES,
    RecordSerializer,
    Stored,
    counter_key,
    dump_record,
    initial_version,
    key_tags,
    load_record,
    record_size,
)

SCOPE, DIGEST = "t0123456789abcdef", "ab" * 32
TAGS = entry_tags(model="m/x y", revision="r1", scope=SCOPE, digest=DIGEST)


def entry(body: bytes = b'{"ok":true}') -> Entry:
    return Entry(
        key=f"te1:{SCOPE}:{DIGEST}",
        endpoint="chat/completions",
        body=body,
        model="m/x y",
        revision="r1",
        created_at=1_800_000_000.0,
        ttl_s=60,
        stale_if_error_s=10,
        etag=make_etag(body),
        tags=TAGS,
        stream_chunks=(b'{"a":1}',),
    )


def test_record_round_trips_entry_and_versions() -> None:
    stored = Stored(entry(), (1, 2**63, 3, 4))
    loaded = load_record(dump_record(stored))
    assert loaded == stored


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"TM",
        b"TM\x02\x00" + encode(entry()),  # a future record format
        b"TM\x01\x04" + b"\x00" * 8,  # versions cut short
        b"TM\x01\x00" + b"TE\x09garbage",  # an entry of an unknown format
        b"XX\x01\x00" + encode(entry()),
    ],
)
def test_anything_but_a_known_record_loads_as_a_miss(raw: bytes) -> None:
    assert load_record(raw) is None
    assert RecordSerializer().loads(raw) is None


def test_serializer_handles_counters_and_refuses_other_values() -> None:
    serializer = RecordSerializer()
    assert serializer.loads(serializer.dumps(12345)) == 12345
    assert serializer.loads(b"17   ") == 17  # memcached pads a counter that lost digits
    assert serializer.loads(None) is None
    with pytest.raises(TypeError):
        serializer.dumps({"pickle": "never"})


def test_versions_must_all_match_the_current_counters() -> None:
    stored = Stored(entry(), (1, 2, 3, 4))
    current: dict[str, int | None] = dict(zip(TAGS, (1, 2, 3, 4), strict=True))
    assert stored.is_current(current)
    for tag in TAGS:
        assert not stored.is_current({**current, tag: current[tag] + 1})  # type: ignore[operator]
        assert not stored.is_current({**current, tag: None})  # an evicted counter invalidates
        assert not stored.is_current({t: v for t, v in current.items() if t != tag})


def test_key_tags_are_the_entrys_own_tenant_and_key_tags() -> None:
    assert key_tags(entry().key) == TAGS[2:]
    assert key_tags("not-a-key") == ()


def test_counter_keys_are_valid_memcached_keys_for_any_tag() -> None:
    for tag in ("model:" + "x" * 1000, "tenant:pub", "model:a%20b"):
        key = counter_key(tag)
        assert len(key) <= 250 and key.isascii() and " " not in key
    assert counter_key("rev:a") != counter_key("rev:b")


def test_initial_versions_are_never_zero_and_differ() -> None:
    versions = {initial_version() for _ in range(100)}
    assert len(versions) == 100 and 0 not in versions


def test_record_size_counts_header_versions_key_and_item_overhead() -> None:
    e = entry()
    assert (
        record_size(e, len(encode(e)))
        == len(dump_record(Stored(e, (1, 2, 3, 4)))) + len(e.key) + ITEM_OVERHEAD_BYTES
    )
    assert struct.calcsize(">Q") == 8
