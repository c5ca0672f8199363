"""Tests for gateway/keys/derive.py: what changes a key, tenant scope, the key format and entry tags."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from cdn.tags import tag_headers
from gateway.keys.canonical import Level, canonicalize
from gateway.keys.derive import (
    KEY_VERSION,
    PUBLIC_SCOPE,
    CacheKey,
    derive_key,
    entry_tags,
    parse_key,
    tenant_scope,
)

CHAT = "chat/completions"
SCOPE = tenant_scope("sk-alice")


def body(content: Any = "Hello", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


def key(
    request: dict[str, Any],
    *,
    scope: str = SCOPE,
    endpoint: str = CHAT,
    level: Level = Level.EXACT,
    revision: str = "rev-1",
) -> str:
    canonical = canonicalize(endpoint, request, level)
    return derive_key(
        scope=scope, endpoint=endpoint, level=level, model_revision=revision, canonical=canonical
    ).key


SHARED = [
    ("reordered keys", body(), dict(reversed(list(body().items())))),
    ("1.0 vs 1", body(max_tokens=8), body(max_tokens=8.0)),
    (
        "temperature 1 vs absent",
        {"model": "m", "messages": []},
        {"model": "m", "messages": [], "temperature": 1},
    ),
    ("stream flag", body(), body(stream=True)),
]


@pytest.mark.parametrize(("a", "b"), [c[1:] for c in SHARED], ids=[c[0] for c in SHARED])
def test_equivalent_requests_share_a_key_at_exact(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert key(a) == key(b)


TEXT_REWRITES = [
    ("trailing space", body("Hello"), body("Hello ")),
    ("zero-width space", body("Hello"), body("Hel\u200blo")),
    (
        "split content parts",
        body([{"type": "text", "text": "Name a "}, {"type": "text", "text": "color."}]),
        body([{"type": "text", "text": "Name a"}, {"type": "text", "text": " color."}]),
    ),
]


@pytest.mark.parametrize(("a", "b"), [c[1:] for c in TEXT_REWRITES], ids=[c[0] for c in TEXT_REWRITES])
def test_text_rewrites_split_keys_at_exact(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert key(a) != key(b)


def test_text_rewrites_share_a_key_only_at_normalized() -> None:
    assert key(body("Hello"), level=Level.NORMALIZED) == key(body(" Hel\u200blo\r\n"), level=Level.NORMALIZED)


DISTINCT = [
    ("different content", body("Hello"), body("Goodbye")),
    ("different model", body(), body() | {"model": "m2"}),
    ("tools", body(), body(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])),
    ("max_tokens", body(max_tokens=8), body(max_tokens=9)),
]


@pytest.mark.parametrize(("a", "b"), [c[1:] for c in DISTINCT], ids=[c[0] for c in DISTINCT])
def test_different_requests_get_different_keys(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert key(a) != key(b)


def test_endpoint_changes_the_key() -> None:
    request = {"model": "m", "prompt": "Hello", "input": "Hello"}
    assert key(request, endpoint="completions") != key(request, endpoint="embeddings")


def test_canonicalization_level_changes_the_key() -> None:
    canonical = canonicalize(CHAT, body("hello"), Level.EXACT)
    keys = {
        derive_key(scope=SCOPE, endpoint=CHAT, level=level, model_revision="r", canonical=canonical).key
        for level in Level
    }
    assert len(keys) == len(Level)


def test_model_revision_changes_the_key() -> None:
    assert key(body(), revision="rev-1") != key(body(), revision="rev-2")


def test_scope_changes_the_key_but_not_the_digest() -> None:
    public = derive_key(
        scope=PUBLIC_SCOPE, endpoint=CHAT, level=Level.EXACT, model_revision="r", canonical={}
    )
    tenant = derive_key(scope=SCOPE, endpoint=CHAT, level=Level.EXACT, model_revision="r", canonical={})
    assert public.key != tenant.key
    assert public.digest == tenant.digest


def test_digest_is_blake2b_256_of_the_documented_canonical_json_at_spec_version_3() -> None:
    derived = derive_key(
        scope="pub", endpoint=CHAT, level=Level.EXACT, model_revision="r", canonical={"b": 1.0, "a": "é"}
    )
    material = (
        '{"endpoint":"chat/completions","level":"exact","request":{"a":"é","b":1},"revision":"r","v":3}'
    )
    assert derived.digest == hashlib.blake2b(material.encode(), digest_size=32).hexdigest()
    assert derived.key == f"te1:pub:{derived.digest}"


def test_key_is_deterministic_and_well_formed() -> None:
    first, second = key(body()), key(body())
    assert first == second
    assert parse_key(first) is not None
    assert first.startswith(f"{KEY_VERSION}:{SCOPE}:")


# --- tenant scope ----------------------------------------------------------------------------------------


def test_tenant_scope_is_the_documented_hash() -> None:
    expected = "t" + hashlib.blake2b(b"sk-alice", digest_size=8, person=b"te-tenant").hexdigest()
    assert tenant_scope("sk-alice") == expected


def test_different_credentials_get_different_scopes() -> None:
    assert tenant_scope("sk-alice") != tenant_scope("sk-bob")


@pytest.mark.parametrize("credential", [None, ""])
def test_missing_credential_is_anonymous(credential: str | None) -> None:
    assert tenant_scope(credential) == "anon"


def test_scope_never_contains_the_credential() -> None:
    assert "alice" not in tenant_scope("sk-alice")


def test_cache_key_refuses_a_raw_credential_as_scope() -> None:
    with pytest.raises(ValueError, match="scope"):
        CacheKey(scope="sk-alice", digest="0" * 64)


def test_cache_key_refuses_a_malformed_digest() -> None:
    with pytest.raises(ValueError, match="digest"):
        CacheKey(scope="pub", digest="xyz")


# --- parse_key -------------------------------------------------------------------------------------------

DIGEST = "0123456789abcdef" * 4

VALID_KEYS = [
    (f"te1:pub:{DIGEST}", "pub"),
    (f"te1:anon:{DIGEST}", "anon"),
    (f"te1:t0123456789abcdef:{DIGEST}", "t0123456789abcdef"),
]


@pytest.mark.parametrize(("text", "scope"), VALID_KEYS)
def test_parse_key_accepts_well_formed_keys(text: str, scope: str) -> None:
    parsed = parse_key(text)
    assert parsed == CacheKey(scope=scope, digest=DIGEST)
    assert parsed is not None and parsed.key == text


INVALID_KEYS = [
    ("wrong version", f"te2:pub:{DIGEST}"),
    ("no version", f"pub:{DIGEST}"),
    ("upper-case digest", f"te1:pub:{DIGEST.upper()}"),
    ("short digest", f"te1:pub:{DIGEST[:-1]}"),
    ("long digest", f"te1:pub:{DIGEST}0"),
    ("unknown scope", f"te1:tag:{DIGEST}"),
    ("short tenant", f"te1:t0123:{DIGEST}"),
    ("upper-case tenant", f"te1:t0123456789ABCDEF:{DIGEST}"),
    ("trailing newline", f"te1:pub:{DIGEST}\n"),
    ("leading space", f" te1:pub:{DIGEST}"),
    ("empty", ""),
    ("path traversal", "te1:pub:../../etc/passwd"),
    ("non-ASCII digits", "te1:pub:" + "٠" * 64),
]


@pytest.mark.parametrize("text", [c[1] for c in INVALID_KEYS], ids=[c[0] for c in INVALID_KEYS])
def test_parse_key_rejects_anything_else(text: str) -> None:
    assert parse_key(text) is None


# --- tags ------------------------------------------------------------------------------------------------


def test_entry_tags_follow_the_design() -> None:
    tags = entry_tags(model="llama-3/8b:instruct", revision="abc123", scope="pub", digest=DIGEST)
    assert tags == ("model:llama-3/8b:instruct", "rev:abc123", "tenant:pub", f"key:{DIGEST}")


TAG_VALUES = [
    ("space", "my model", "model:my%20model"),
    ("comma", "a,b", "model:a%2Cb"),
    ("tab and newline", "a\tb\n", "model:a%09b%0A"),
    ("control char", "a\x00b", "model:a%00b"),
    ("percent escaped too", "a%20b", "model:a%2520b"),
    ("quote and semicolon", 'a"b;c', "model:a%22b%3Bc"),
    ("non-ASCII", "modèle", "model:mod%C3%A8le"),
]


@pytest.mark.parametrize(("model", "expected"), [c[1:] for c in TAG_VALUES], ids=[c[0] for c in TAG_VALUES])
def test_tags_are_plain_values_escaped_once_in_the_header(model: str, expected: str) -> None:
    tag = entry_tags(model=model, revision="r", scope="pub", digest=DIGEST)[0]
    assert tag == f"model:{model}"  # stored plain: the one escaper is cdn.tags.encode_tag
    header = tag_headers([tag], ["surrogate-key"])[0]["Surrogate-Key"]
    assert header == expected
    assert header.isascii() and header.isprintable() and " " not in header and "," not in header


def test_tag_encoding_keeps_different_values_apart() -> None:
    a = tag_headers(entry_tags(model="a b", revision="r", scope="pub", digest=DIGEST), ["xkey"])
    b = tag_headers(entry_tags(model="a%20b", revision="r", scope="pub", digest=DIGEST), ["xkey"])
    assert a != b


def test_key_from_bytes_equals_the_canonical_json_derivation() -> None:
    import hashlib

    from gateway.keys.canonical import CANON_VERSION, canonical_json
    from gateway.keys.derive import derive_key_from_bytes

    canonical = {"messages": [{"content": 'h\u00e9llo "q"', "role": "user"}], "model": "m", "temperature": 0}
    material = canonical_json(
        {
            "v": CANON_VERSION,
            "endpoint": "chat/completions",
            "level": "tokens",
            "revision": "r\u00e9v",
            "request": canonical,
        }
    )
    expected = hashlib.blake2b(material, digest_size=32).hexdigest()
    key = derive_key_from_bytes(
        scope="pub",
        endpoint="chat/completions",
        level=Level.TOKENS,
        model_revision="r\u00e9v",
        canonical_bytes=canonical_json(canonical),
    )
    assert key.digest == expected
