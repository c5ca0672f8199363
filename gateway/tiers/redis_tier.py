"""L2: the Redis tier shared by every worker and gateway instance (redis.asyncio + hiredis).

Layout: the entry under its key (`te1:{scope}:{digest}`), expiring at the end of its stale-if-error window, and one
set per tag (`te1:tag:{tag}`) listing keys, for purge. Writes are one pipelined round trip.

A Redis failure never fails a request: every operation goes through the shared `Breaker` (tiers/base.py), which
counts the error, logs at a bounded rate and opens a short breaker so an outage costs one timeout per
`retry_after_s`, not one per request. The connection pool reconnects by itself once Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from gateway.keys.entry import Entry, decode, encode
from gateway.tiers.base import Breaker, L2Unavailable, settle_batch
from gateway.tiers.redis_reads import batch_reads_for

log = logging.getLogger("tokenedge.l2")
TAG_PREFIX = "te1:tag:"
# Recently read values, decoded once: a hot entry read from Redis again and again comes back as the same bytes, so
# the decoded Entry (immutable) is kept by those exact bytes (a dict compares them whole: no aliasing). Bounded by
# the bytes of the values it keys; cleared when full (a hot set re-fills it at once).
DECODED_MAX_BYTES = 4 * 1024 * 1024
_T = TypeVar("_T")
__all__ = ["L2Unavailable", "RedisTier"]


class RedisTier:
    name = "l2"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        retry_after_s: float,
        clock: Callable[[], float],
        on_error: Callable[[], None],
        client: aioredis.Redis | None = None,
    ) -> None:
        self._client = (
            client
            if client is not None
            else aioredis.Redis.from_url(
                url,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),  # fail fast; the breaker below decides when to try again
                health_check_interval=0,
            )
        )
        # Batched reads on their own lean connection where Redis is plain TCP (gateway.tiers.redis_reads).
        self._reads = batch_reads_for(self._client, timeout_s) if client is None else None
        self._clock = clock
        self._breaker = Breaker(
            label="redis",
            errors=(RedisError,),
            timeout_s=timeout_s * 4,
            retry_after_s=retry_after_s,
            clock=clock,
            on_error=on_error,
            log=log,
        )
        self._pending: dict[str, list[asyncio.Future[bytes | None]]] = {}
        self._decoded: dict[bytes, Entry] = {}
        self._decoded_bytes = 0
        self._reader: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self._reads is not None:
            await self._reads.close()
        await self._client.aclose()

    @property
    def available(self) -> bool:
        return self._breaker.available

    async def _call(self, op: str, fn: Callable[[], Awaitable[_T]]) -> _T:
        """The one path through which every Redis operation runs and every Redis failure degrades."""
        return await self._breaker.call(op, fn)

    async def get(self, key: str) -> Entry | None:
        """Reads are batched: lookups that arrive while a read is in flight go out together as one MGET.

        Under load this turns N round trips into one; alone, a lookup costs exactly one command.
        """
        raw = await self.read(key)
        return self.entry_of(raw)

    def read(self, key: str) -> asyncio.Future[bytes | None]:
        """`get` without the coroutine (the fast lane waits on it with a callback): the raw value, batched; raises
        L2Unavailable at once while the breaker is open."""
        if not self.available:
            raise L2Unavailable("l2 skipped for get: breaker open")
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key, []).append(future)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read_batches())
        return future

    def entry_of(self, raw: bytes | None) -> Entry | None:
        """The entry a raw value holds (decoded once per distinct value), or None."""
        return self._decode(raw) if raw is not None else None

    def _decode(self, raw: bytes) -> Entry | None:
        entry = self._decoded.get(raw)
        if entry is None:
            entry = decode(raw)
            if entry is not None and len(raw) <= DECODED_MAX_BYTES // 16:
                if self._decoded_bytes + len(raw) > DECODED_MAX_BYTES:
                    self._decoded.clear()
                    self._decoded_bytes = 0
                self._decoded[raw] = entry
                self._decoded_bytes += len(raw)
        return entry

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        """Concurrent gets: they leave as one batched MGET."""
        return list(await asyncio.gather(*(self.get(key) for key in keys)))

    async def _read_batches(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            keys = list(batch)
            try:
                values = await self._call("get", lambda keys=keys: self._mget(keys))  # type: ignore[misc]
            except L2Unavailable as exc:
                settle_batch(batch, None, exc)
                continue
            settle_batch(batch, (v if isinstance(v, bytes | None) else str(v).encode() for v in values))

    async def _mget(self, keys: list[str]) -> list[bytes | str | None]:
        if self._reads is not None:
            return list(await self._reads.mget(keys))
        return list(await self._client.mget(keys))

    async def set(self, entry: Entry) -> bool:
        expire_ms = max(1, int((entry.expires_at() - self._clock()) * 1000))
        payload = encode(entry)

        async def write() -> None:
            pipe = self._client.pipeline(transaction=False)
            pipe.set(entry.key, payload, px=expire_ms)
            for tag in entry.tags:
                pipe.sadd(TAG_PREFIX + tag, entry.key)
                # A tag set lives as long as its longest-lived member; stale members are harmless on purge.
                pipe.pexpire(TAG_PREFIX + tag, expire_ms, gt=True)
                pipe.pexpire(TAG_PREFIX + tag, expire_ms, nx=True)
            await pipe.execute()

        await self._call("set", write)
        return True

    async def delete(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        return int(await self._call("delete", lambda: self._client.delete(*keys)))

    async def purge_tags(self, tags: Iterable[str]) -> tuple[int, list[str]]:
        """Delete every entry carrying any of the tags; returns (entries deleted, their keys)."""
        tag_keys = [TAG_PREFIX + t for t in tags]
        if not tag_keys:
            return 0, []

        async def purge() -> tuple[int, list[str]]:
            members = await self._client.sunion(tag_keys)
            keys = sorted(m.decode() if isinstance(m, bytes) else m for m in members)
            pipe = self._client.pipeline(transaction=False)
            if keys:
                pipe.delete(*keys)
            pipe.delete(*tag_keys)
            results = await pipe.execute()
            return (int(results[0]) if keys else 0), keys

        return await self._call("purge", purge)

    async def ping(self) -> bool:
        try:
            return bool(await self._call("ping", self._client.ping))
        except L2Unavailable:
            return False

    async def stats(self) -> tuple[int, int] | None:
        """(keys, used bytes) of the Redis database, or None when unavailable."""
        try:
            info = await self._call("info", lambda: self._client.info("memory"))
            size = await self._call("dbsize", self._client.dbsize)
        except L2Unavailable:
            return None
        return int(size), int(info.get("used_memory", 0))
