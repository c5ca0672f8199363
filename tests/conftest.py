"""Suite-wide fixtures: real services started once per session on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.services import RedisServer


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
