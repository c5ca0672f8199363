"""The cache entry: one versioned record per key, shared by every tier and by both response forms.

An entry holds the upstream's answer whole: the JSON body served on a `stream: false` hit (for a JSON miss the
upstream's own bytes, so a hit is byte-identical to the first answer; for a streamed miss every field of every
chunk merged by `gateway.misses.streaming.forms`), the recorded stream chunks when the miss was streamed (so a
streamed hit replays the original chunks, byte for byte), usage, the model revision and the tags used for purge.
`stream_only`: the chunks hold a field no rule turns into JSON, so there is no JSON form (empty `body`, the ETag
hashes the chunks) and a JSON request misses (`policy.lacks`). A hit's `id` and `created` are the first answer's.
Serialized form: `b"TE"`, a format-version byte, a 4-byte header length, an orjson header, then the body.
An unknown format version decodes to None, which every tier treats as a miss: a format change needs no migration.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.keys.sizing import compact, held, json_held

ENTRY_FORMAT = 2  # 2: `stream_only`, and every field of the answer kept (1 dropped unknown ones)
_MAGIC = b"TE"
_PREFIX = struct.Struct(">2sBI")


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    endpoint: str  # "chat/completions" | "completions" | "embeddings"
    body: bytes  # the JSON completion served on a `stream: false` hit
    model: str
    revision: str
    created_at: float  # wall-clock seconds: entries are shared across processes through Redis
    ttl_s: int
    stale_if_error_s: int
    etag: str  # strong validator: a hash of the body
    tags: tuple[str, ...]
    usage: Mapping[str, Any] | None = None
    stream_chunks: tuple[bytes, ...] | None = (
        None  # the upstream's `data:` payloads, in order, without [DONE]
    )
    stream_only: bool = False  # no JSON form: a streamed field of unknown merge rule (streaming.forms)

    def __post_init__(self) -> None:
        # Kept for the entry's lifetime, counted by `size_bytes`: exact-size objects only (see gateway.keys.sizing).
        object.__setattr__(self, "body", compact(self.body))
        if self.stream_chunks is not None:
            object.__setattr__(self, "stream_chunks", tuple(compact(chunk) for chunk in self.stream_chunks))

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.created_at)

    def expires_at(self) -> float:
        """When no tier needs to keep the entry any more: the end of its stale-if-error window."""
        return self.created_at + self.ttl_s + self.stale_if_error_s

    def size_bytes(self) -> int:
        """Bytes this entry holds in a process: itself and every object it owns, as the allocator sizes them.

        Checked against tracemalloc in tests/gateway/test_memory_tier.py. The endpoint is a shared constant.
        """
        total = (
            held(self)
            + held(self.key)
            + held(self.body)
            + held(self.model)
            + held(self.revision)
            + held(self.created_at)
            + json_held(self.ttl_s)
            + json_held(self.stale_if_error_s)
            + held(self.etag)
            + held(self.tags)
            + sum(held(tag) for tag in self.tags)
        )
        if self.usage is not None:
            total += json_held(self.usage)
        if self.stream_chunks is not None:
            total += held(self.stream_chunks) + sum(held(chunk) for chunk in self.stream_chunks)
        return total


def make_etag(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


def encode(entry: Entry) -> bytes:
    header = orjson.dumps(
        {
            "key": entry.key,
            "endpoint": entry.endpoint,
            "model": entry.model,
            "revision": entry.revision,
            "created_at": entry.created_at,
            "ttl_s": entry.ttl_s,
            "stale_if_error_s": entry.stale_if_error_s,
            "etag": entry.etag,
            "tags": entry.tags,
            "usage": entry.usage,
            "stream_chunks": [c.decode() for c in entry.stream_chunks]
            if entry.stream_chunks is not None
            else None,
            "stream_only": entry.stream_only,
        }
    )
    return _PREFIX.pack(_MAGIC, ENTRY_FORMAT, len(header)) + header + entry.body


def decode(raw: bytes) -> Entry | None:
    """Parse a stored entry; None for anything that is not a well-formed entry of a known format version."""
    if len(raw) < _PREFIX.size:
        return None
    magic, version, header_len = _PREFIX.unpack_from(raw)
    if magic != _MAGIC or version != ENTRY_FORMAT or _PREFIX.size + header_len > len(raw):
        return None
    try:
        header = orjson.loads(raw[_PREFIX.size : _PREFIX.size + header_len])
        chunks = header["stream_chunks"]
        return Entry(
            key=header["key"],
            endpoint=header["endpoint"],
            body=raw[_PREFIX.size + header_len :],
            model=header["model"],
            revision=header["revision"],
            created_at=float(header["created_at"]),
            ttl_s=int(header["ttl_s"]),
            stale_if_error_s=int(header["stale_if_error_s"]),
            etag=header["etag"],
            tags=tuple(header["tags"]),
            usage=header["usage"],
            stream_chunks=tuple(c.encode() for c in chunks) if chunks is not None else None,
            stream_only=header["stream_only"] is True,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
