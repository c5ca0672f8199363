"""Per-tenant engine salts (`upstream.engine_salt`): the `cache_salt` a miss carries to engines that accept it.

An engine's prefix cache is a timing channel: a tenant whose prompt starts like another tenant's gets its first
token sooner, and so learns that the other sent that prefix (CVE-2025-46570 against vLLM). vLLM's `cache_salt`
closes it: blocks are reused only between requests with the same salt. vLLM's documentation says the salt must be
set by the gateway, never trusted from the client, so here it is derived from the tenant scope by a keyed hash
(the deployment's scope secret under its own personalisation; never the credential, which the scope already
hides), and a client's own `cache_salt` is replaced. A public route's requests share one cache, as they share
their answers: they carry no salt, and a client's is removed. Off by default: OpenAI's API refuses unknown fields.
The router's prefix chains are seeded by the same field (`facts`), so placement follows the salted caches.
Pure functions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import orjson

FIELD: Final = "cache_salt"
_PERSON: Final = b"te-engine-salt"


def engine_salt(secret: bytes, scope: str) -> str:
    """The salt of tenant `scope`: a keyed hash, the same on every worker and replica sharing the secret."""
    key = hashlib.blake2b(secret, digest_size=32, person=_PERSON).digest()
    return hashlib.blake2b(scope.encode(), key=key, digest_size=16, person=_PERSON).hexdigest()


def for_scope(secret: bytes, scope: str, *, public: bool) -> str:
    """The salt a request in `scope` carries: none on a public route."""
    return "" if public else engine_salt(secret, scope)


def salted(raw: bytes, body: Mapping[str, Any], salt: str) -> tuple[bytes, Mapping[str, Any]]:
    """The request with its `cache_salt` set to `salt` ("" : removed); unchanged bytes when nothing changes."""
    if (salt and body.get(FIELD) == salt) or (not salt and FIELD not in body):
        return raw, body
    out = {k: v for k, v in body.items() if k != FIELD}
    if salt:
        out[FIELD] = salt
    return orjson.dumps(out), out
