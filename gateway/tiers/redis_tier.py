"""L2: the Redis tier shared by every worker and gateway instance (redis.asyncio + hiredis).

Layout: the entry under its key (`te1:{scope}:{digest}`), expiring at the end of its stale-if-error window, one set
per tag (`te1:tag:{tag}`) listing keys, for purge, and one purge epoch (`te1:epoch`), a counter every purge bumps.
The purge discipline (docs/coherence.md): a purge is one Lua script that bumps the epoch and deletes what it names,
members of its tag sets included, in one step (P1); a store is one Lua script that writes the entry and indexes it
under its tags only while the epoch still holds the value taken before the upstream call (P2). One global epoch:
any purge refuses every store in flight when it lands (each still answers its own request; the next miss stores);
per-tag epochs would spare unrelated fills but need an epoch read per tag on every store.
`RedisClusterTier` (gateway/tiers/redis_cluster.py) overrides the names: the same scripts run per bucket of keys.

A Redis failure never fails a request: every operation goes through the shared `Breaker` (tiers/base.py), which
counts the error, logs at a bounded rate and opens a short breaker so an outage costs one timeout per
`retry_after_s`, not one per request. The connection pool reconnects by itself once Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from gateway.keys.entry import Entry, decode, encode
from gateway.tiers.base import Breaker, Epoch, L2Unavailable, settle_batch
from gateway.tiers.redis_reads import batch_reads_for

log = logging.getLogger("tokenedge.l2")
TAG_PREFIX = "te1:tag:"
EPOCH_KEY = "te1:epoch"
# P2. KEYS: entry, epoch, tag sets; ARGV: the epoch as taken ('' when absent), payload, px, the entry's name.
STORE_SCRIPT = """
if (redis.call('get', KEYS[2]) or '') ~= ARGV[1] then return 0 end
redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
for i = 3, #KEYS do
  redis.call('sadd', KEYS[i], ARGV[4])
  redis.call('pexpire', KEYS[i], ARGV[3], 'GT')
  redis.call('pexpire', KEYS[i], ARGV[3], 'NX')
end
return 1
"""
# P1. KEYS: epoch, then entries (by key) or tag sets (by tag); ARGV: 'keys' | 'tags', a random start for an absent
# epoch (an evicted epoch never comes back to a value a store took). Returns {deleted, names}; DEL goes 1,000
# names at a time (Lua's unpack has a stack limit).
PURGE_SCRIPT = """
if redis.call('exists', KEYS[1]) == 0 then redis.call('set', KEYS[1], ARGV[2]) end
redis.call('incr', KEYS[1])
local names = {}
if ARGV[1] == 'tags' then
  names = redis.call('sunion', unpack(KEYS, 2))
else
  for i = 2, #KEYS do names[i - 1] = KEYS[i] end
end
local deleted = 0
for i = 1, #names, 1000 do
  deleted = deleted + redis.call('del', unpack(names, i, math.min(i + 999, #names)))
end
if ARGV[1] == 'tags' then redis.call('del', unpack(KEYS, 2)) end
return {deleted, names}
"""
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
        on_refusal: Callable[[str], None] = lambda reason: None,
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
        self._on_refusal = on_refusal
        self._store = self._client.register_script(STORE_SCRIPT)
        self._purge = self._client.register_script(PURGE_SCRIPT)

    # The layout: where a key's entry, its purge epoch and its tag sets live (one bucket on a single node).
    def stored_name(self, key: str) -> str:
        return key

    def key_of(self, name: str) -> str:
        return name

    def epoch_key(self, key: str) -> str:
        return EPOCH_KEY

    def tag_key(self, key: str, tag: str) -> str:
        return TAG_PREFIX + tag

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

    async def epoch(self, key: str, tags: Sequence[str]) -> Epoch:
        """P2: the purge epoch of `key`'s bucket now ('' while no purge ever ran), before the upstream call."""
        value = await self._call("epoch", lambda: self._client.get(self.epoch_key(key)))
        return value.decode() if isinstance(value, bytes) else str(value or "")

    async def set(self, entry: Entry, epoch: Epoch) -> bool:
        """P2: written with its tag index in one script, only while the epoch is still `epoch`."""
        expire_ms = max(1, int((entry.expires_at() - self._clock()) * 1000))
        keys = [self.stored_name(entry.key), self.epoch_key(entry.key)]
        keys += [self.tag_key(entry.key, tag) for tag in entry.tags]
        args: list[str | bytes | int] = [str(epoch), encode(entry), expire_ms, self.stored_name(entry.key)]
        stored = int(await self._call("set", lambda: self._store(keys=keys, args=args)))
        if not stored:
            self._on_refusal("purged")
        return bool(stored)

    async def delete(self, keys: Iterable[str]) -> int:
        """P1: bump the epoch and delete, in one script (per bucket)."""
        count, _ = await self._purged("delete", "keys", self._by_bucket(keys))
        return count

    async def purge_tags(self, tags: Iterable[str]) -> tuple[int, list[str]]:
        """P1: every entry carrying any of the tags, its tag sets and an epoch bump, in one script (per bucket);
        returns (entries deleted, their keys)."""
        tags = list(tags)
        if not tags:
            return 0, []
        return await self._purged("purge", "tags", self._every_bucket(tags))

    def _by_bucket(self, keys: Iterable[str]) -> dict[str, list[str]]:
        """epoch key -> the stored names of the keys in its bucket."""
        buckets: dict[str, list[str]] = {}
        for key in keys:
            buckets.setdefault(self.epoch_key(key), []).append(self.stored_name(key))
        return buckets

    def _every_bucket(self, tags: list[str]) -> dict[str, list[str]]:
        return {EPOCH_KEY: [TAG_PREFIX + tag for tag in tags]}

    async def _purged(self, op: str, kind: str, buckets: dict[str, list[str]]) -> tuple[int, list[str]]:
        if not buckets:
            return 0, []
        start = str(secrets.randbits(48) + 1)

        async def purge() -> list[list[object]]:
            return [
                await self._purge(keys=[epoch, *names], args=[kind, start])
                for epoch, names in buckets.items()
            ]

        return self._counted(await self._call(op, purge))

    def _counted(self, replies: list[list[object]]) -> tuple[int, list[str]]:
        deleted = sum(int(reply[0]) for reply in replies)  # type: ignore[call-overload]
        names = [n.decode() if isinstance(n, bytes) else str(n) for r in replies for n in r[1]]  # type: ignore[attr-defined]
        return deleted, sorted(self.key_of(name) for name in names)

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
