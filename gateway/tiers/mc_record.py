"""What the Memcached tier stores: the entry record wrapped with the tag versions it was stored under, and counters.

Memcached has no sets, so purge by tag is namespace versioning: every tag has a version counter (an ASCII decimal
that `incr` bumps), and a stored value records the version of each of its tags at store time. A read whose
recorded versions differ from the current counters is a miss. Counters start at a random 62-bit value, never at
0, so a counter that was evicted and recreated never matches an old recording (an absent counter invalidates).

Stored form: `b"TM"`, a format-version byte, a tag-count byte, one big-endian u64 per tag (in `entry.tags`
order), then the project's entry record (`gateway.keys.entry.encode`, itself versioned). No pickle, no JSON beyond
the entry's own header. An unknown format version, or anything else unparseable, loads as None: a miss.
Pure functions plus the aiocache serializer that applies them.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from dataclasses import dataclass
from typing import Any, Final

from aiocache.serializers import BaseSerializer

from gateway.keys.derive import parse_key
from gateway.keys.entry import Entry, decode, encode

RECORD_FORMAT: Final = 1
_MAGIC: Final = b"TM"
_HEAD: Final = struct.Struct(">2sBB")
_VERSION: Final = struct.Struct(">Q")
COUNTER_PREFIX: Final = "te1:tv:"
ITEM_OVERHEAD_BYTES: Final = 64  # memcached's per-item header (48) + key terminator + CAS, rounded up


@dataclass(frozen=True, slots=True)
class Stored:
    entry: Entry
    versions: tuple[int, ...]  # one per entry.tags, as read from the counters when the entry was stored

    def is_current(self, current: dict[str, int | None]) -> bool:
        """Every tag's counter exists and still holds the recorded version (else the entry was purged)."""
        tags = self.entry.tags
        return len(tags) == len(self.versions) and all(
            current.get(tag) == version for tag, version in zip(tags, self.versions, strict=True)
        )


def counter_key(tag: str) -> str:
    """A tag's version counter: hashed, so any tag fits memcached's 250-byte, no-whitespace key rule."""
    return COUNTER_PREFIX + hashlib.blake2b(tag.encode(), digest_size=16).hexdigest()


def key_tags(key: str) -> tuple[str, ...]:
    """The tags known from the key alone (tenant and digest), so their counters join the entry's own read."""
    parsed = parse_key(key)
    if parsed is None:
        return ()
    return (f"tenant:{parsed.scope}", f"key:{parsed.digest}")


def initial_version() -> int:
    return secrets.randbits(62) + 1


def record_size(entry: Entry, entry_bytes: int) -> int:
    """The bytes memcached needs for this item: our header, the record, the key and its item overhead."""
    return _HEAD.size + _VERSION.size * len(entry.tags) + entry_bytes + len(entry.key) + ITEM_OVERHEAD_BYTES


def dump_record(stored: Stored) -> bytes:
    if len(stored.versions) != len(stored.entry.tags) or len(stored.versions) > 255:
        raise ValueError("a stored record needs one version per tag (at most 255 tags)")
    versions = b"".join(_VERSION.pack(v) for v in stored.versions)
    return _HEAD.pack(_MAGIC, RECORD_FORMAT, len(stored.versions)) + versions + encode(stored.entry)


def load_record(raw: bytes) -> Stored | None:
    if len(raw) < _HEAD.size:
        return None
    magic, version, count = _HEAD.unpack_from(raw)
    start = _HEAD.size + _VERSION.size * count
    if magic != _MAGIC or version != RECORD_FORMAT or len(raw) < start:
        return None
    entry = decode(raw[start:])
    if entry is None:
        return None
    versions = tuple(_VERSION.unpack_from(raw, _HEAD.size + i * _VERSION.size)[0] for i in range(count))
    return Stored(entry, versions)


class RecordSerializer(BaseSerializer):
    """aiocache serializer: `Stored` records and integer counters as bytes; anything else loads as None."""

    DEFAULT_ENCODING = None  # values travel as bytes, never decoded as text

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, Stored):
            return dump_record(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return str(value).encode()
        raise TypeError(f"the memcached tier stores records and counters, not {type(value).__name__}")

    def loads(self, value: Any) -> Stored | int | None:
        if not isinstance(value, bytes):
            return None
        if value.startswith(_MAGIC):
            return load_record(value)
        stripped = value.strip()  # memcached pads a counter that shrank in digits with spaces
        return int(stripped) if stripped.isdigit() else None
