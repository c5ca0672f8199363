"""cdn/purge/retry.py: the pure retry decision, Retry-After parsing, and the driver against timeouts and
refused connections (through a real client, so the aiohttp error translation is covered too)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from cdn.purge import FastlyConfig, FastlyPurgeClient, RetryPolicy
from cdn.purge.retry import is_retryable_status, parse_retry_after_s, retry_delay_s
from tests.cdn.fakes import FakeFastly, MaxJitter, RecordingSleep, Reply, client_session, serve

POLICY = RetryPolicy(max_attempts=4, base_delay_s=0.5, max_delay_s=1.5, max_retry_after_s=30)


@pytest.mark.parametrize(
    ("status", "retry"),
    [
        (429, True),
        (500, True),
        (503, True),
        (599, True),
        (400, False),
        (401, False),
        (404, False),
        (200, False),
    ],
)
def test_retryable_statuses(status: int, retry: bool) -> None:
    assert is_retryable_status(status) is retry


def test_backoff_is_exponential_capped_and_stops_after_max_attempts() -> None:
    assert [retry_delay_s(POLICY, a, None, MaxJitter()) for a in (1, 2, 3, 4)] == [0.5, 1.0, 1.5, None]


def test_jitter_draws_below_the_ceiling() -> None:
    class Low:
        def uniform(self, a: float, b: float) -> float:
            return a

    assert retry_delay_s(POLICY, 3, None, Low()) == 0.0


def test_retry_after_wins_and_is_capped() -> None:
    assert retry_delay_s(POLICY, 1, 12.0, MaxJitter()) == 12.0
    assert retry_delay_s(POLICY, 1, 3600.0, MaxJitter()) == 30


def test_retry_after_parses_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert parse_retry_after_s("120", now) == 120.0
    assert (
        parse_retry_after_s(format_datetime(datetime(2026, 1, 1, 0, 0, 9, tzinfo=UTC), usegmt=True), now)
        == 9.0
    )
    assert parse_retry_after_s("soon", now) is None and parse_retry_after_s(None, now) is None


def test_policy_validates() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(timeout_s=0)


async def test_a_stalled_server_times_out_and_is_retried() -> None:
    fake = FakeFastly("tok-SECRET", "svc")
    fake.delay_s = 2.0
    sleep = RecordingSleep()
    policy = RetryPolicy(max_attempts=2, timeout_s=0.2)
    async with client_session() as session, serve(fake) as url:
        client = FastlyPurgeClient(
            FastlyConfig("tok-SECRET", "svc", base_url=url, retry=policy),
            session,
            sleep=sleep,
            rng=MaxJitter(),
        )
        result = await client.purge([], ["t1"])
    assert not result.ok and result.requests == 2 and len(sleep.delays) == 1
    assert "no response within 0.2s" in result.errors[0]


async def test_a_refused_connection_is_retried_then_reported() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleep = RecordingSleep()
    async with client_session() as session:
        config = FastlyConfig(
            "tok-SECRET", "svc", base_url=f"http://127.0.0.1:{port}", retry=RetryPolicy(max_attempts=3)
        )
        result = await FastlyPurgeClient(config, session, sleep=sleep, rng=MaxJitter()).purge([], ["t1"])
    assert not result.ok and result.requests == 3 and sleep.delays == [0.5, 1.0]
    assert "ClientConnectorError" in result.errors[0] and "tok-SECRET" not in result.errors[0]


async def test_a_failed_batch_does_not_stop_the_next_one() -> None:
    fake = FakeFastly("tok-SECRET", "svc")
    fake.queue(Reply(400, "bad"))
    async with client_session() as session, serve(fake) as url:
        client = FastlyPurgeClient(
            FastlyConfig("tok-SECRET", "svc", base_url=url), session, sleep=RecordingSleep(), rng=MaxJitter()
        )
        result = await client.purge([], [f"t{i}" for i in range(300)])
    assert not result.ok and result.requests == 2 and result.purged == 44 and len(result.errors) == 1
