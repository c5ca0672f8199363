"""The L2 read path's own connection (gateway/tiers/redis_reads.py) against a real redis-server.

It must read exactly what redis-py reads (values, misses, binary data, the URL's database and credentials), keep
pipelined replies matched to their reads, and fail the way the tier's breaker expects (redis-py's exception types)
when Redis is down, slow or refuses the credentials, reconnecting by itself once Redis is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.tiers.redis_reads import BatchReads, batch_reads_for, pack
from gateway.tiers.redis_tier import RedisTier
from harness.services import RedisServer

VALUES = {"te1:a": b"x" * 3000, "te1:b": bytes(range(256)), "te1:\u00e9": b"\r\n$-1\r\n"}


def reads(url: str, timeout_s: float = 2.0) -> BatchReads:
    found = batch_reads_for(aioredis.Redis.from_url(url), timeout_s)
    assert found is not None
    return found


@pytest.fixture
def db3(redis_url: str) -> Iterator[str]:
    url = redis_url.rsplit("/", 1)[0] + "/3"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.mset(VALUES)
    yield url
    client.flushdb()
    client.close()


def test_pack_is_resp2() -> None:
    assert pack("MGET", "k", b"\x00") == b"*3\r\n$4\r\nMGET\r\n$1\r\nk\r\n$1\r\n\x00\r\n"


async def test_reads_what_redis_py_reads_from_the_urls_database(db3: str) -> None:
    keys = [*VALUES, "te1:missing", "te1:a"]
    lean = reads(db3)
    try:
        assert await lean.mget(keys) == list(await aioredis.Redis.from_url(db3).mget(keys))
        assert await lean.mget(keys) == [*VALUES.values(), None, VALUES["te1:a"]]
    finally:
        await lean.close()


async def test_pipelined_reads_each_get_their_own_reply(db3: str) -> None:
    lean = reads(db3)
    try:
        keys = [[key] for key in VALUES] * 20
        replies = await asyncio.gather(*(lean.mget(k) for k in keys))
        assert replies == [[VALUES[k[0]]] for k in keys]
    finally:
        await lean.close()


async def test_credentials_from_the_url_and_a_refusal_is_a_redis_error(redis_server: RedisServer) -> None:
    admin = redis.Redis(host="127.0.0.1", port=redis_server.port)
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">s3cret", "~*", "+@all")
    admin.set("te1:auth", b"ok")
    base = f"redis://{{}}@127.0.0.1:{redis_server.port}/0"
    good, bad = reads(base.format("reader:s3cret")), reads(base.format("reader:wrong"))
    try:
        assert await good.mget(["te1:auth"]) == [b"ok"]
        with pytest.raises(RedisError):
            await bad.mget(["te1:auth"])
    finally:
        await good.close()
        await bad.close()
        admin.execute_command("ACL", "DELUSER", "reader")
        admin.close()


async def test_redis_down_is_a_connection_error_and_the_next_read_reconnects(
    redis_server: RedisServer,
) -> None:
    redis_server.flush()
    redis.Redis(host="127.0.0.1", port=redis_server.port).set("te1:k", b"v")
    lean = reads(redis_server.url)
    try:
        assert await lean.mget(["te1:k"]) == [b"v"]
        redis_server.stop()
        with pytest.raises(RedisError):
            await lean.mget(["te1:k"])
        redis_server.start()
        redis.Redis(host="127.0.0.1", port=redis_server.port).set("te1:k", b"again")
        assert await lean.mget(["te1:k"]) == [b"again"]
    finally:
        await lean.close()
        if redis_server.proc is None:
            redis_server.start()


async def test_a_slow_redis_times_out_and_the_connection_is_replaced(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    admin.set("te1:k", b"v")
    lean = reads(redis_url, timeout_s=0.2)
    try:
        assert await lean.mget(["te1:k"]) == [b"v"]
        admin.execute_command("CLIENT", "PAUSE", "1000", "ALL")  # every client's commands wait 1 s
        with pytest.raises(RedisError, match="timed out"):
            await lean.mget(["te1:k"])
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.set("te1:k", b"w")
        assert await lean.mget(["te1:k"]) == [b"w"]  # a new connection: the late reply ("v") is never misread
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        await lean.close()


def test_only_plain_tcp_redis_gets_the_lean_connection() -> None:
    def lean(url: str) -> bool:
        tier = RedisTier(url, timeout_s=1.0, retry_after_s=1.0, clock=lambda: 0.0, on_error=lambda: None)
        return tier._reads is not None

    assert lean("redis://127.0.0.1:6379/0")
    assert not lean("rediss://127.0.0.1:6379/0")  # TLS: redis-py
    assert not lean("unix:///tmp/redis.sock")
    assert not lean("redis://127.0.0.1:6379/0?protocol=3")
