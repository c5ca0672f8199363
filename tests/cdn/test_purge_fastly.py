"""Fastly purge client against a local fake of https://www.fastly.com/documentation/reference/api/purging/
(POST /service/{service_id}/purge, Surrogate-Key header with up to 256 space-separated keys, Fastly-Key
auth, Fastly-Soft-Purge: 1)."""

from __future__ import annotations

import logging

import pytest

from cdn.purge import FastlyConfig, FastlyPurgeClient, RetryPolicy
from tests.cdn.fakes import KEY, KEY_TAG, FakeFastly, MaxJitter, RecordingSleep, Reply, client_session, serve

TOKEN = "fastly-token-SECRET-0123456789"
SERVICE = "SU1Z0isxPaozGVKXdv0eY"


def _client(url: str, session, sleep=None, **kw) -> FastlyPurgeClient:  # type: ignore[no-untyped-def]
    config = FastlyConfig(api_token=TOKEN, service_id=SERVICE, base_url=url, **kw)
    return FastlyPurgeClient(config, session, sleep=sleep or RecordingSleep(), rng=MaxJitter())


async def test_happy_path_purges_keys_and_tags_in_one_request() -> None:
    fake = FakeFastly(TOKEN, SERVICE)
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([KEY], ["model:m1", "tenant:t1"])
    assert not fake.violations
    assert result.ok and result.purged == 3 and result.requests == 1 and result.errors == ()
    (req,) = fake.requests
    assert req.headers["Surrogate-Key"] == f"{KEY_TAG} tenant:t1 model:m1"
    assert "Fastly-Soft-Purge" not in req.headers


async def test_600_keys_go_out_in_3_batches_of_at_most_256() -> None:
    fake = FakeFastly(TOKEN, SERVICE)
    tags = [f"t{i}" for i in range(600)]
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session).purge([], tags)
    assert not fake.violations
    assert [len(r.headers["Surrogate-Key"].split(" ")) for r in fake.requests] == [256, 256, 88]
    assert sorted(fake.keys()) == sorted(tags)
    assert result.ok and result.purged == 600 and result.requests == 3


async def test_soft_purge_sends_fastly_soft_purge_1() -> None:
    fake = FakeFastly(TOKEN, SERVICE)
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session, soft=True).purge([], ["model:m1"])
    assert result.ok and fake.requests[0].headers["Fastly-Soft-Purge"] == "1"


async def test_retries_503_with_backoff_then_succeeds() -> None:
    fake = FakeFastly(TOKEN, SERVICE)
    fake.queue(Reply(503, {"msg": "busy"}), Reply(503, {"msg": "busy"}))
    sleep = RecordingSleep()
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session, sleep=sleep).purge([], ["model:m1"])
    assert result.ok and result.requests == 3 and result.purged == 1
    assert sleep.delays == [0.5, 1.0]  # full jitter at its ceiling: base * 2**(attempt-1)


async def test_no_retry_on_400_and_the_failure_is_reported_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeFastly(TOKEN, SERVICE)
    # A hostile or careless upstream echoing the credential back must not leak it into logs or results.
    fake.queue(Reply(400, f"bad request for key {TOKEN}".encode()))
    sleep = RecordingSleep()
    caplog.set_level(logging.DEBUG)
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session, sleep=sleep).purge([], ["model:m1"])
    assert not result.ok and result.purged == 0 and result.requests == 1 and sleep.delays == []
    assert "HTTP 400" in result.errors[0] and "***" in result.errors[0]
    assert TOKEN not in "".join(result.errors) and TOKEN not in caplog.text


async def test_retry_exhaustion_is_logged_redacted(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeFastly(TOKEN, SERVICE)
    fake.queue(*[Reply(500, TOKEN.encode())] * 4)
    caplog.set_level(logging.DEBUG)
    async with client_session() as session, serve(fake) as url:
        result = await _client(url, session, retry=RetryPolicy(max_attempts=2)).purge([], ["a", "b"])
    assert not result.ok and result.requests == 2 and "HTTP 500" in result.errors[0]
    assert "giving up after 2 attempts" in caplog.text
    assert TOKEN not in caplog.text and TOKEN not in repr(result)


def test_config_repr_redacts_the_token() -> None:
    config = FastlyConfig(api_token=TOKEN, service_id=SERVICE)
    assert TOKEN not in repr(config) and "api_token=***" in repr(config) and SERVICE in repr(config)


@pytest.mark.parametrize("kw", [{"api_token": ""}, {"service_id": ""}, {"max_keys_per_request": 257}])
def test_config_validates(kw: dict[str, object]) -> None:
    args: dict[str, object] = {"api_token": TOKEN, "service_id": SERVICE, **kw}
    with pytest.raises(ValueError):
        FastlyConfig(**args)  # type: ignore[arg-type]
