"""The invalidation message every process applies to its own L1: purged keys and tags, or a new model revision.

Pure data and a versioned wire form (orjson, a `v` field first): an unknown version or a malformed message decodes
to None, and the receiver then treats its L1 as unknowable and drops it (see `Coherence.apply_raw`), since
ignoring an invalidation it cannot read could leave a purged entry in memory.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import orjson

WIRE_VERSION = 1
ACK_PREFIX = b'{"ack":'  # acks share the local relay with invalidations; this prefix tells them apart
_serial = itertools.count(1)


def process_origin() -> str:
    """This process's name on the bus: host-unique pid plus a random suffix (pids repeat across replicas)."""
    return f"{os.getpid()}-{os.urandom(4).hex()}"


@dataclass(frozen=True, slots=True)
class Invalidation:
    origin: str  # the publishing process, which has already applied it
    id: str  # unique per publish: origin and a counter (acks name it)
    sent_at: float  # wall-clock seconds at publish, for the lag measured by receivers
    keys: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    model: str | None = None  # with `revision`: this model now answers with this revision
    revision: str | None = None

    @classmethod
    def purge(cls, origin: str, now: float, keys: tuple[str, ...], tags: tuple[str, ...]) -> Invalidation:
        return cls(origin, f"{origin}:{next(_serial)}", now, keys=keys, tags=tags)

    @classmethod
    def new_revision(cls, origin: str, now: float, model: str, revision: str) -> Invalidation:
        return cls(origin, f"{origin}:{next(_serial)}", now, model=model, revision=revision)


def encode(msg: Invalidation) -> bytes:
    doc: dict[str, Any] = {"v": WIRE_VERSION, "origin": msg.origin, "id": msg.id, "sent_at": msg.sent_at}
    if msg.keys:
        doc["keys"] = msg.keys
    if msg.tags:
        doc["tags"] = msg.tags
    if msg.model is not None and msg.revision is not None:
        doc["model"], doc["revision"] = msg.model, msg.revision
    return orjson.dumps(doc)


def _strings(value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return tuple(value)


def decode(raw: bytes) -> Invalidation | None:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("v") != WIRE_VERSION:
        return None
    keys, tags = _strings(doc.get("keys", [])), _strings(doc.get("tags", []))
    origin, msg_id, sent_at = doc.get("origin"), doc.get("id"), doc.get("sent_at")
    model, revision = doc.get("model"), doc.get("revision")
    if keys is None or tags is None or not isinstance(origin, str) or not isinstance(msg_id, str):
        return None
    if not isinstance(sent_at, int | float) or (model is None) != (revision is None):
        return None
    if model is not None and not (isinstance(model, str) and isinstance(revision, str)):
        return None
    return Invalidation(origin, msg_id, float(sent_at), keys=keys, tags=tags, model=model, revision=revision)


def encode_ack(msg_id: str, by: str, lag_s: float) -> bytes:
    """`by` applied message `msg_id`, `lag_s` after it was sent (wall clocks: across hosts, only indicative)."""
    return orjson.dumps({"ack": msg_id, "by": by, "lag_s": lag_s})


def decode_ack(raw: bytes) -> tuple[str, str] | None:
    """(message id, acking process), or None."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("ack"), str) or not isinstance(doc.get("by"), str):
        return None
    return doc["ack"], doc["by"]
