"""Cloudflare purge client against a local fake of POST /client/v4/zones/{zone_id}/purge_cache
(https://developers.cloudflare.com/api/go/resources/cache/methods/purge: body {"tags": [...]}, Bearer token,
envelope {"success", "errors", "messages", "result"}; limit of 100 operations per request from
https://developers.cloudflare.com/cache/how-to/purge-cache/)."""

from __future__ import annotations

import logging

import pytest

from cdn.purge import CloudflareConfig, CloudflarePurgeClient
from tests.cdn.fakes import (
    KEY,
    KEY_TAG,
    FakeCloudflare,
    MaxJitter,
    RecordingSleep,
    Reply,
    client_session,
    serve,
)

TOKEN = "cf-token-SECRET-abcdef0123456789"
ZONE = "023e105f4ecef8ad9ca31a8372d0c353"


def _client(url: str, session, sleep=None, **kw) -> CloudflarePurgeClient:  # type: ignore[no-untyped-def]
    config = CloudflareConfig(api_token=TOKEN, zone_id=ZONE, base_url=url, **kw)
    return CloudflarePurgeClient(config, session, sleep=sleep or RecordingSleep(), rng=MaxJitter())


async def test_happy_path_posts_tags_json() -> None:
    fake = FakeCloudflare(TOKEN, ZONE)
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([KEY], ["model:m1"])
    assert not fake.violations
    assert fake.requests[0].json() == {"tags": [KEY_TAG, "model:m1"]}
    assert result.ok and result.purged == 2 and result.requests == 1


async def test_250_tags_go_out_in_batches_of_100() -> None:
    fake = FakeCloudflare(TOKEN, ZONE)
    tags = [f"t{i}" for i in range(250)]
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([], tags)
    assert not fake.violations
    assert [len(r.json()["tags"]) for r in fake.requests] == [100, 100, 50]  # type: ignore[index]
    assert fake.tags() == tags and result.purged == 250 and result.requests == 3


async def test_success_false_envelope_is_a_failure_with_its_errors() -> None:
    fake = FakeCloudflare(TOKEN, ZONE)
    fake.queue(
        Reply(
            200,
            {
                "success": False,
                "errors": [{"code": 1134, "message": "tag purge not allowed"}],
                "messages": [],
                "result": None,
            },
        )
    )
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([], ["model:m1"])
    assert not result.ok and result.purged == 0 and result.requests == 1
    assert "1134: tag purge not allowed" in result.errors[0]


async def test_429_honours_retry_after_then_succeeds() -> None:
    fake = FakeCloudflare(TOKEN, ZONE)
    fake.queue(
        Reply(
            429,
            {"success": False, "errors": [{"code": 10000, "message": "rate limited"}]},
            {"Retry-After": "7"},
        )
    )
    sleep = RecordingSleep()
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session, sleep=sleep).purge([], ["model:m1"])
    assert result.ok and result.requests == 2 and sleep.delays == [7.0]


async def test_403_is_not_retried_and_token_stays_out_of_logs(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCloudflare(TOKEN, ZONE)
    fake.queue(
        Reply(
            403,
            {
                "success": False,
                "errors": [{"code": 10000, "message": f"Authentication error for Bearer {TOKEN}"}],
            },
        )
    )
    sleep = RecordingSleep()
    caplog.set_level(logging.DEBUG)
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session, sleep=sleep).purge([], ["model:m1"])
    assert not result.ok and result.requests == 1 and sleep.delays == []
    assert "Authentication error" in result.errors[0]
    assert TOKEN not in "".join(result.errors) and TOKEN not in caplog.text


def test_config_repr_redacts_the_token() -> None:
    assert TOKEN not in repr(CloudflareConfig(api_token=TOKEN, zone_id=ZONE))
