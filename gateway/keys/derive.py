"""Cache keys, tenant scope and entry tags (design §3).

A key is `te1:{scope}:{digest}`. The digest covers the canonical request (at the `tokens` level: the model's input
ids and the tokenizer version beside the other fields) together with everything that can change the answer
without changing the request: endpoint, the canonicalization level actually used and the spec version (so a
spec change simply misses), and the model revision, so a model upgrade never serves old answers. The scope keeps tenants apart: it is a hash
of the caller's credential (never the credential itself) or `pub` on public routes. Pure functions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.keys.canonical import CANON_VERSION, Level, canonical_json

KEY_VERSION: Final = "te1"
PUBLIC_SCOPE: Final = "pub"
ANONYMOUS_SCOPE: Final = "anon"

_SCOPE: Final = r"(?:pub|anon|t[0-9a-f]{16})"
_SCOPE_RE: Final = re.compile(_SCOPE)
_DIGEST_RE: Final = re.compile(r"[0-9a-f]{64}")
_KEY_RE: Final = re.compile(rf"{KEY_VERSION}:({_SCOPE}):([0-9a-f]{{64}})")
_TENANT_PERSON: Final = b"te-tenant"


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A validated key; `key` is the string stored in every tier and shown in `X-Cache-Key`."""

    scope: str
    digest: str

    def __post_init__(self) -> None:
        if not _SCOPE_RE.fullmatch(self.scope):
            raise ValueError("cache key scope must be 'pub', 'anon' or 't' + 16 hex digits")
        if not _DIGEST_RE.fullmatch(self.digest):
            raise ValueError("cache key digest must be 64 lowercase hex digits")

    @property
    def key(self) -> str:
        return f"{KEY_VERSION}:{self.scope}:{self.digest}"


def tenant_scope(credential: str | None) -> str:
    """The scope of a tenant: a keyed BLAKE2b-64 of its credential; `anon` without one."""
    if not credential:
        return ANONYMOUS_SCOPE
    digest = hashlib.blake2b(
        credential.encode("utf-8", "surrogatepass"), digest_size=8, person=_TENANT_PERSON
    )
    return "t" + digest.hexdigest()


def derive_key(
    *,
    scope: str,
    endpoint: str,
    level: Level,
    model_revision: str,
    canonical: Mapping[str, Any],
    wire: bytes = b"",
) -> CacheKey:
    """The key of a canonical request (from `canonicalize`) in `scope`; BLAKE2b-256 of canonical JSON."""
    return derive_key_from_bytes(
        scope=scope,
        endpoint=endpoint,
        level=level,
        model_revision=model_revision,
        canonical_bytes=canonical_json(canonical),
        wire=wire,
    )


def derive_key_from_bytes(
    *, scope: str, endpoint: str, level: Level, model_revision: str, canonical_bytes: bytes, wire: bytes = b""
) -> CacheKey:
    """`derive_key` over an already serialized canonical request (the hot path memoizes those bytes).

    The material is exactly `canonical_json({"v", "endpoint", "level", "revision", "request"})`, spelled out in
    sorted key order so the request is not walked again, then, when the request's headers or query carry key
    material (`gateway.keys.parts.wire_material`), a newline and those bytes (canonical JSON holds no raw newline,
    so the two parts cannot be confused).
    """
    material = b"".join(
        (
            b'{"endpoint":',
            orjson.dumps(endpoint),
            b',"level":',
            orjson.dumps(Level(level).value),
            b',"request":',
            canonical_bytes,
            b',"revision":',
            orjson.dumps(model_revision),
            b',"v":',
            str(CANON_VERSION).encode(),
            b"}",
            b"\n" + wire if wire else b"",
        )
    )
    return CacheKey(scope=scope, digest=hashlib.blake2b(material, digest_size=32).hexdigest())


def parse_key(key: str) -> CacheKey | None:
    """The key spelled by `key`, or None when it is not exactly a current-version key."""
    match = _KEY_RE.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        return None
    return CacheKey(scope=match[1], digest=match[2])


def entry_tags(*, model: str, revision: str, scope: str, digest: str) -> tuple[str, ...]:
    """The tags of an entry, for purge and CDN surrogate keys, as plain values (`model:my model`).

    They are escaped once, per CDN, where they become a header (`cdn.tags.encode_tag`), and only there.
    """
    return (f"model:{model}", f"rev:{revision}", f"tenant:{scope}", f"key:{digest}")
