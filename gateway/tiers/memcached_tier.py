"""L2 on Memcached, through aiocache's Memcached backend (aiomcache), beside the Redis tier.

Layout: the entry under its key as a `Stored` record (tiers/mc_record.py: the entry record plus the versions of
its tags at store time) and one version counter per tag. With several servers, a key lives on one server chosen
by rendezvous hashing, and every server keeps its own copy of each tag counter, so a read touches one server.

A hit is one round trip: the read batch (lookups that arrive while a read is in flight leave together as one
`get k1 k2 ...`) also asks for the counters of each key's `tenant:`/`key:` tags (known from the key) and of the
`model:`/`rev:` tags this worker has seen recently. Only an entry carrying a tag the worker has not seen yet
needs a second read, once per worker and model/revision. Versions are always read fresh, so a purge is seen by
the next read: there is no staleness window in L2 (L1's cross-worker bound is in the README).

The purge discipline (docs/coherence.md): purge by tag is one `incr` per tag and server, atomic on each counter and
with no index to lose a member (P1); purge by key bumps the key's `key:` counter the same way, then deletes the
item. A store records the versions its tags had when the fill began, read by `epoch` before the upstream call,
not when it writes (P2): a purge in between leaves it recorded under an old version, a miss for every read. So the
per-tag counters are this tier's purge epoch, and only the tags purged refuse a store. A record too big for a
memcached item is refused and counted (never truncated). Every failure goes through the per-server `Breaker`: it degrades to a
miss, counted in `cache_errors_total{tier="l2"}`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiomcache
from aiocache import MemcachedCache
from aiomcache.exceptions import ClientException

from gateway.keys.entry import Entry, encode
from gateway.tiers.base import Breaker, Epoch, L2Unavailable, settle_batch
from gateway.tiers.mc_record import (
    RecordSerializer,
    Stored,
    counter_key,
    initial_version,
    key_tags,
    record_size,
)

log = logging.getLogger("tokenedge.l2")
MAX_RELATIVE_EXPIRY_S = 30 * 24 * 3600  # memcached reads larger exptimes as absolute unix times
KNOWN_TAGS = 64  # model:/rev: tags whose counters join every read (most recently seen first kept)
KNOWN_TAG_IDLE_S = 600.0


class _Client(aiomcache.Client):
    """aiomcache 0.8.2 spins without yielding when a server closes mid-command (`readline` at EOF returns b""
    forever); here an early EOF is a connection error, which the breaker turns into a miss."""

    async def _execute_simple_command(self, conn: Any, raw_command: bytes) -> bytes:
        conn.writer.write(raw_command)
        await conn.writer.drain()
        line: bytes = await conn.reader.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionResetError("memcached closed the connection")
        return line[:-2]


def parse_server(spec: str) -> tuple[str, int]:
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"memcached server must be host:port, got {spec!r}")
    return host.strip("[]"), int(port)


class _Shard:
    """One memcached server: its aiocache client, its breaker and its read batcher."""

    def __init__(self, spec: str, breaker: Breaker, pool_size: int) -> None:
        host, port = parse_server(spec)
        self.spec = spec
        self.breaker = breaker
        self.cache = MemcachedCache(
            serializer=RecordSerializer(), endpoint=host, port=port, pool_size=pool_size, timeout=None
        )
        self.cache.client = _Client(host, port, pool_size=pool_size)
        self.pending: dict[str, list[asyncio.Future[Entry | None]]] = {}
        self.reader: asyncio.Task[None] | None = None


class MemcachedTier:
    name = "l2"

    def __init__(
        self,
        servers: Sequence[str],
        *,
        timeout_s: float,
        retry_after_s: float,
        max_item_bytes: int,
        clock: Callable[[], float],
        on_error: Callable[[], None],
        on_refusal: Callable[[str], None],
        pool_size: int = 4,
    ) -> None:
        if not servers:
            raise ValueError("the memcached tier needs at least one server")
        self._shards = [
            _Shard(
                spec,
                Breaker(
                    label=f"memcached {spec}",
                    errors=(ClientException, EOFError),
                    timeout_s=timeout_s * 4,
                    retry_after_s=retry_after_s,
                    clock=clock,
                    on_error=on_error,
                    log=log,
                ),
                pool_size,
            )
            for spec in servers
        ]
        self._max_item_bytes = max_item_bytes
        self._clock = clock
        self._on_refusal = on_refusal
        self._known: OrderedDict[str, float] = OrderedDict()  # model:/rev: tag -> last seen

    async def close(self) -> None:
        for shard in self._shards:
            await shard.cache.close()

    @property
    def available(self) -> bool:
        return any(shard.breaker.available for shard in self._shards)

    def _shard(self, key: str) -> _Shard:
        if len(self._shards) == 1:
            return self._shards[0]
        return max(
            self._shards, key=lambda s: hashlib.blake2b(f"{s.spec}|{key}".encode(), digest_size=8).digest()
        )

    async def get(self, key: str) -> Entry | None:
        return await self.read(key)

    def read(self, key: str) -> asyncio.Future[Entry | None]:
        """`get` without the coroutine (the fast lane waits on it with a callback), batched per server; raises
        L2Unavailable at once while the key's server is breaker-open."""
        shard = self._shard(key)
        if not shard.breaker.available:
            raise L2Unavailable("l2 skipped for get: breaker open")
        future: asyncio.Future[Entry | None] = asyncio.get_running_loop().create_future()
        shard.pending.setdefault(key, []).append(future)
        if shard.reader is None or shard.reader.done():
            shard.reader = asyncio.ensure_future(self._read_batches(shard))
        return future

    @staticmethod
    def entry_of(value: Entry | None) -> Entry | None:
        """`read` already yields the checked entry (its tags' counters were read with it)."""
        return value

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        """Concurrent gets: they leave as one batched read per server."""
        return list(await asyncio.gather(*(self.get(key) for key in keys)))

    async def _read_batches(self, shard: _Shard) -> None:
        while shard.pending:
            batch, shard.pending = shard.pending, {}
            try:
                entries = await self._read(shard, list(batch))
            except L2Unavailable as exc:
                settle_batch(batch, None, exc)
                continue
            settle_batch(batch, entries)

    async def _read(self, shard: _Shard, keys: list[str]) -> list[Entry | None]:
        """One `get` for the entries and the counters of their tags; a second only for tags never seen."""
        tags = list(dict.fromkeys([t for key in keys for t in key_tags(key)] + list(self._known)))
        values = await shard.breaker.call(
            "get", lambda: shard.cache.multi_get(keys + [counter_key(t) for t in tags])
        )
        current: dict[str, int | None] = {
            t: _counter(v) for t, v in zip(tags, values[len(keys) :], strict=True)
        }
        found = [
            v if isinstance(v, Stored) and v.entry.key == key else None
            for key, v in zip(keys, values[: len(keys)], strict=True)
        ]
        unseen = list(
            dict.fromkeys(t for s in found if s is not None for t in s.entry.tags if t not in current)
        )
        if unseen:
            current.update(await self._counters(shard, unseen))
        self._remember(s.entry.tags for s in found if s is not None)
        return [s.entry if s is not None and s.is_current(current) else None for s in found]

    async def _counters(self, shard: _Shard, tags: list[str]) -> dict[str, int | None]:
        values = await shard.breaker.call(
            "get", lambda: shard.cache.multi_get([counter_key(t) for t in tags])
        )
        return {t: _counter(v) for t, v in zip(tags, values, strict=True)}

    def _remember(self, tag_lists: Iterable[tuple[str, ...]]) -> None:
        """Keep the recently seen model:/rev: tags, whose counters then ride along with every read."""
        now = self._clock()
        for tags in tag_lists:
            for tag in tags:
                if tag.startswith(("model:", "rev:")):
                    self._known[tag] = now
                    self._known.move_to_end(tag)
        while self._known and (
            len(self._known) > KNOWN_TAGS or now - next(iter(self._known.values())) > KNOWN_TAG_IDLE_S
        ):
            self._known.popitem(last=False)

    async def epoch(self, key: str, tags: Sequence[str]) -> Epoch:
        """P2: the versions of the tags now (counters created where absent), before the upstream call."""
        tags = list(dict.fromkeys(tags))
        return dict(zip(tags, await self._versions_for_store(self._shard(key), tags), strict=True))

    async def set(self, entry: Entry, epoch: Epoch) -> bool:
        """Store under the tag versions `epoch` took (P2); False when refused as too large."""
        taken = epoch if isinstance(epoch, dict) else {}
        if any(tag not in taken for tag in entry.tags):
            self._on_refusal("untagged")  # a ticket for other tags: it cannot say what was purged since
            return False
        payload_bytes = len(encode(entry))
        if record_size(entry, payload_bytes) > self._max_item_bytes:
            self._on_refusal("too_large")
            return False
        shard = self._shard(entry.key)
        versions = tuple(int(taken[tag]) for tag in entry.tags)
        expire_s = max(1, min(MAX_RELATIVE_EXPIRY_S, int(entry.expires_at() - self._clock()) + 1))
        stored = await shard.breaker.call(
            "set", lambda: _set_or_refuse(shard, entry.key, Stored(entry, versions), expire_s)
        )
        if not stored:
            self._on_refusal("server_refused")
            return False
        self._remember([entry.tags])
        return True

    async def _versions_for_store(self, shard: _Shard, tags: list[str]) -> tuple[int, ...]:
        current = await self._counters(shard, tags)
        absent = [t for t, v in current.items() if v is None]
        if absent:
            added = await shard.breaker.call(
                "set", lambda: asyncio.gather(*(_add_counter(shard, t) for t in absent))
            )
            current.update(zip(absent, added, strict=True))
            raced = [t for t, v in zip(absent, added, strict=True) if v is None]
            if raced:  # another writer created these first: read back its values
                current.update(await self._counters(shard, raced))
        if any(v is None for v in current.values()):
            raise L2Unavailable("l2 set: a tag counter vanished while storing")
        return tuple(int(current[t] or 0) for t in tags)

    async def delete(self, keys: Iterable[str]) -> int:
        """P1: the key's `key:` counter first (a store begun before cannot validate after it), then the item."""
        by_shard: dict[int, list[str]] = {}
        for key in keys:
            by_shard.setdefault(id(self._shard(key)), []).append(key)
        deleted = 0
        for shard in self._shards:
            mine = by_shard.get(id(shard), [])
            if mine:
                digests = [t for key in mine for t in key_tags(key) if t.startswith("key:")]
                await shard.breaker.call("delete", functools.partial(_incr_all, shard, digests))
                deleted += await shard.breaker.call("delete", functools.partial(_delete_all, shard, mine))
        return deleted

    async def purge_tags(self, tags: Iterable[str]) -> tuple[int, list[str]]:
        """One `incr` per tag and server; returns (tags that had live entries, []): entries are not enumerable."""
        tags = list(dict.fromkeys(tags))
        bumped: set[str] = set()
        for shard in self._shards:
            results = await shard.breaker.call("purge", functools.partial(_incr_all, shard, tags))
            bumped.update(t for t, ok in zip(tags, results, strict=True) if ok)
        return len(bumped), []

    async def ping(self) -> bool:
        try:
            for shard in self._shards:
                await shard.breaker.call("ping", functools.partial(shard.cache.raw, "version"))
        except L2Unavailable:
            return False
        return True

    async def stats(self) -> tuple[int, int] | None:
        """(items, bytes) summed over the servers (counters included), or None when one is unavailable."""
        items = used = 0
        try:
            for shard in self._shards:
                stats = await shard.breaker.call("stats", functools.partial(shard.cache.raw, "stats"))
                items += int(stats.get(b"curr_items") or 0)
                used += int(stats.get(b"bytes") or 0)
        except L2Unavailable:
            return None
        return items, used


def _counter(value: object) -> int | None:
    return value if isinstance(value, int) else None


async def _set_or_refuse(shard: _Shard, key: str, stored: Stored, expire_s: int) -> bool:
    """False when the server refuses the item as too large (its `-I` is below our limit): counted, not an outage."""
    try:
        return bool(await shard.cache.set(key, stored, ttl=expire_s))
    except ClientException as exc:
        if "object too large" in str(exc):  # aiomcache folds the server's reply into the message
            return False
        raise


async def _add_counter(shard: _Shard, tag: str) -> int | None:
    """Create a tag's counter at a fresh random version; None when another writer created it first."""
    version = initial_version()
    try:
        await shard.cache.add(counter_key(tag), version)
    except ValueError:
        return None
    return version


async def _delete_all(shard: _Shard, keys: list[str]) -> int:
    return sum(await asyncio.gather(*(shard.cache.delete(k) for k in keys)))


async def _incr_all(shard: _Shard, tags: list[str]) -> list[bool]:
    return list(await asyncio.gather(*(_incr(shard, t) for t in tags)))


async def _incr(shard: _Shard, tag: str) -> bool:
    """Bump a tag's version; False when it has no counter (then no stored entry can validate against it)."""
    try:
        await shard.cache.raw("incr", counter_key(tag).encode(), 1)
    except ClientException as exc:
        if "NOT_FOUND" in str(exc):
            return False
        raise
    return True
