"""Akamai Fast Purge v3 by tag (https://techdocs.akamai.com/purge-cache/reference/api) and EdgeGrid signing.

The signer is checked against the published vectors of Akamai's reference client
(https://github.com/akamai/AkamaiOPEN-edgegrid-python, akamai/edgegrid/test/testdata.json); the fake
verifies every request's signature with an independent implementation (tests/cdn/fakes.py).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from itertools import count

import pytest

from cdn.purge import AkamaiConfig, AkamaiPurgeClient, EdgeGridCredentials
from cdn.purge.edgegrid import edgegrid_timestamp, sign_request, signing_key
from tests.cdn.fakes import KEY, FakeAkamai, MaxJitter, RecordingSleep, Reply, client_session, serve

# testdata.json of the reference client.
VEC_BASE = "https://akaa-baseurl-xxxxxxxxxxx-xxxxxxxxxxxxx.luna.akamaiapis.net"
VEC_CREDS = EdgeGridCredentials(
    client_token="akab-client-token-xxx-xxxxxxxxxxxxxxxx",
    client_secret="xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx=",
    access_token="akab-access-token-xxx-xxxxxxxxxxxxxxxx",
)
VEC_TS = "20140321T19:34:21+0000"
VEC_NONCE = "nonce-xx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
VEC_HEADERS_TO_SIGN = ("X-Test1", "X-Test2", "X-Test3")
VECTORS = [
    # (name, method, path, body, headers, signature)
    ("simple GET", "GET", "/", b"", {}, "tL+y4hxyHxgWVD30X3pWnGKHcPzmrIF+LThiAOhMxYU="),
    (
        "GET with querystring",
        "GET",
        "/testapi/v1/t1?p1=1&p2=2",
        b"",
        {},
        "hKDH1UlnQySSHjvIcZpDMbQHihTQ0XyVAKZaApabdeA=",
    ),
    (
        "POST inside limit",
        "POST",
        "/testapi/v1/t3",
        b"data" * 8,
        {},
        "hXm4iCxtpN22m4cbZb4lVLW5rhX8Ca82vCFqXzSTPe4=",
    ),
    (
        "POST too large",
        "POST",
        "/testapi/v1/t3",
        b"d" * 4096,
        {},
        "6Q6PiTipLae6n4GsSIDTCJ54bEbHUBp+4MUXrbQCBoY=",
    ),
    (
        "POST length equals max_body",
        "POST",
        "/testapi/v1/t3",
        b"d" * 2048,
        {},
        "6Q6PiTipLae6n4GsSIDTCJ54bEbHUBp+4MUXrbQCBoY=",
    ),
    ("POST empty body", "POST", "/testapi/v1/t6", b"", {}, "1gEDxeQGD5GovIkJJGcBaKnZ+VaPtrc4qBUHixjsPCQ="),
    (
        "simple header",
        "GET",
        "/testapi/v1/t4",
        b"",
        {"X-Test1": "test-simple-header"},
        "8F9AybcRw+PLxnvT+H0JRkjROrrUgsxJTnRXMzqvcwY=",
    ),
    (
        "header with spaces",
        "GET",
        "/testapi/v1/t4",
        b"",
        {"X-Test1": '"     test-header-with-spaces     "'},
        "ucq2AbjCNtobHfCTuS38fdkl5UDdWHZhQX46fYR8CqI=",
    ),
    (
        "headers out of order",
        "GET",
        "/testapi/v1/t4",
        b"",
        {"X-Test2": "t2", "X-Test1": "t1", "X-Test3": "t3"},
        "Wus73Nx8jOYM+kkBFF2q8D1EATRIMr0WLWwpLBgkBqY=",
    ),
    (
        "extra header",
        "GET",
        "/testapi/v1/t5",
        b"",
        {"X-Test2": "t2", "X-Test1": "t1", "X-Test3": "t3", "X-Extra": "this won't be included"},
        "Knd/jc0A5Ghhizjayr0AUUvl2MZjBpS3FDSzvtq4Ixc=",
    ),
    ("PUT test", "PUT", "/testapi/v1/t6", b"P" * 31, {}, "GNBWEYSEWOLtu+7dD52da2C39aX/Jchpon3K/AmBqBU="),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "headers", "signature"), VECTORS, ids=[v[0] for v in VECTORS]
)
def test_signature_matches_the_reference_vectors(
    name: str, method: str, path: str, body: bytes, headers: dict[str, str], signature: str
) -> None:
    auth = sign_request(
        method,
        VEC_BASE + path,
        body,
        VEC_CREDS,
        VEC_TS,
        VEC_NONCE,
        headers=headers,
        headers_to_sign=VEC_HEADERS_TO_SIGN,
        max_body=2048,
    )
    assert auth == (
        f"EG1-HMAC-SHA256 client_token={VEC_CREDS.client_token};access_token={VEC_CREDS.access_token};"
        f"timestamp={VEC_TS};nonce={VEC_NONCE};signature={signature}"
    )


def test_signing_key_and_timestamp_format() -> None:
    assert signing_key(VEC_CREDS.client_secret, VEC_TS) == "znsRMDBRqTXGJ7Ojip3/h2FGPu3LuoMYWgv9PKEnE/o="
    assert edgegrid_timestamp(datetime(2014, 3, 21, 19, 34, 21, tzinfo=UTC)) == VEC_TS


CREDS = EdgeGridCredentials(
    client_token="akab-ct-SECRET-1111", client_secret="cs-SECRET-2222/+=", access_token="akab-at-SECRET-3333"
)


def _client(url: str, session, sleep=None, **kw) -> AkamaiPurgeClient:  # type: ignore[no-untyped-def]
    config = AkamaiConfig(host="akab-xxxx.purge.akamaiapis.net", credentials=CREDS, base_url=url, **kw)
    nonces = count()
    return AkamaiPurgeClient(
        config,
        session,
        sleep=sleep or RecordingSleep(),
        rng=MaxJitter(),
        clock=lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        nonce=lambda: f"nonce-{next(nonces)}",
    )


def _fake() -> FakeAkamai:
    return FakeAkamai(CREDS.client_token, CREDS.client_secret, CREDS.access_token)


async def test_invalidate_by_tag_is_signed_and_spelled_for_akamai() -> None:
    fake = _fake()
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([KEY], ["model:org/m1"])
    assert not fake.violations  # includes the fake's own signature check
    (req,) = fake.requests
    assert req.path == "/ccu/v3/invalidate/tag/production"
    assert req.json() == {"objects": ["key%3A" + "ab" * 32, "model%3Aorg%2Fm1"]}
    assert "timestamp=20260102T03:04:05+0000;nonce=nonce-0;" in req.headers["Authorization"]
    assert result.ok and result.purged == 2 and result.requests == 1


async def test_delete_on_staging() -> None:
    fake = _fake()
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session, operation="delete", network="staging").purge([], ["t1"])
    assert result.ok and fake.requests[0].path == "/ccu/v3/delete/tag/staging"


async def test_large_purges_are_split_under_the_50000_byte_body_limit() -> None:
    fake = _fake()
    tags = [f"tag-{i:04d}-{'x' * 100}" for i in range(1000)]
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([], tags)
    assert not fake.violations
    assert len(fake.requests) == 3 and all(len(r.body) <= 50_000 for r in fake.requests)
    assert fake.objects() == tags and result.purged == 1000


async def test_a_retry_is_signed_again_with_a_fresh_nonce() -> None:
    fake = _fake()
    fake.queue(Reply(503, {"httpStatus": 503, "title": "Service Unavailable"}))
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([], ["t1"])
    assert not fake.violations and fake.nonces == ["nonce-0", "nonce-1"]
    assert result.ok and result.requests == 2


async def test_a_bad_secret_fails_the_fake_signature_check(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeAkamai(CREDS.client_token, "another-secret", CREDS.access_token)
    caplog.set_level(logging.DEBUG)
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([], ["t1"])
    assert fake.violations == ["signature mismatch"]
    assert not result.ok and result.requests == 1  # 400: not retried
    for secret in (CREDS.client_secret, CREDS.access_token, CREDS.client_token):
        assert secret not in caplog.text and secret not in "".join(result.errors)


def test_config_repr_redacts_credentials() -> None:
    text = repr(AkamaiConfig(host="akab-xxxx.purge.akamaiapis.net", credentials=CREDS))
    assert "akab-xxxx.purge.akamaiapis.net" in text
    for secret in (CREDS.client_secret, CREDS.access_token, CREDS.client_token):
        assert secret not in text
