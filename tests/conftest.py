"""Suite-wide fixtures: real services started once per session on free loopback ports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from harness.gateway import FakeClock
from harness.services import MemcachedServer, RedisServer
from tests.support.fake_upstream import FakeUpstream, start_fake_upstream


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None:
        redis_server.start()
    redis_server.flush()
    return redis_server.url


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[MemcachedServer]:
    server = MemcachedServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def memcached(memcached_server: MemcachedServer) -> MemcachedServer:
    """The session's memcached, running and empty (restarted: a kill is also the fastest flush)."""
    memcached_server.kill()
    memcached_server.start()
    return memcached_server


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    """The scriptable upstream of gateway and edge tests (tests/support/fake_upstream.py)."""
    yield FakeUpstream()


@pytest.fixture
async def upstream_url(fake: FakeUpstream) -> AsyncIterator[str]:
    server = await start_fake_upstream(fake)
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
