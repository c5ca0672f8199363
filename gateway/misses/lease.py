"""Cross-replica coalescing: on an L2 miss one replica takes a short lease on the key in Redis, the others wait.

Single-flight (gateway/misses/singleflight.py) merges identical misses inside one process; this module merges them across
processes and hosts sharing one Redis, after memcache's leases ("Scaling Memcache at Facebook", NSDI 2013):
- the leader of a local flight runs `SET te1:lease:{key} TOKEN NX PX ttl`; whoever gets it fills the key and renews
  the lease every ttl/3 while the fill runs, so a live holder keeps it however long the generation takes and a dead
  one (crashed, partitioned) stops renewing and loses it after at most `cache.lease_ttl_s`;
- the release is token-checked (a Lua script deletes the lease only if it still holds our token) and, in the same
  script, publishes `1{key}` (stored) or `0{key}` (not stored) on one pub/sub channel, `te1:lease:done`;
- a replica that did not get the lease waits for that message, bounded by the lease's remaining time (PTTL), then
  reads the entry: found -> served as a coalesced answer; "not stored" -> it goes upstream itself (an error or an
  uncacheable answer is never shared across replicas); lease gone without an entry -> it tries to take the lease
  (one waiter wins, so a dead holder costs one more upstream call, not N); past `cache.lease_max_wait_s` -> it goes
  upstream itself.
The pub/sub message only shortens the wait: a lost subscription degrades to polling at most every lease TTL, never
to a wrong answer. A Redis error degrades to no lease (plain per-process single-flight), counted in
`tokenedge_lease_total{outcome="error"}`. This channel is deliberately separate from the invalidation bus
(issue 13): it carries wake-ups, not invalidations, and losing one is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import Counter

from gateway.keys.entry import Entry
from gateway.tiers.redis_cluster import REDIS_FAILURES

# What a lease command can raise when Redis fails: redis-py's errors, a timeout, a socket error, and the
# AttributeError redis-py's async cluster connections raise when a command reuses a connection that a cancelled
# (timed-out) command left without a writer. Each degrades to no lease, counted; none is a gateway error.
LEASE_FAILURES: tuple[type[BaseException], ...] = (*REDIS_FAILURES, AttributeError)

log = logging.getLogger("tokenedge.lease")
LEASE_PREFIX = "te1:lease:"
CHANNEL = "te1:lease:done"
CLOCK_SLACK_S = 1.0  # an entry created this long before the wait began still counts as the holder's answer
ACQUIRED = -3  # the acquire script's answer when the lease is ours; otherwise it returns the holder's PTTL

# KEYS[1] lease; ARGV token, ttl_ms. Ours: ACQUIRED; held: its PTTL (ms, or -1 / -2 as PTTL says).
_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return -3 end
return redis.call('pttl', KEYS[1])
"""
# KEYS[1] lease; ARGV token, channel, message. Deletes and announces only while the token is still ours.
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', ARGV[2], ARGV[3])
  return 1
end
return 0
"""
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""

Reader = Callable[[], Awaitable[Entry | None]]


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    ttl_s: float
    max_wait_s: float
    timeout_s: float


class Lease:
    """A held lease: renewed in the background until `release`, which says whether the entry was stored."""

    def __init__(self, owner: Leases, key: str, token: str) -> None:
        self.key = key
        self._owner = owner
        self._token = token
        self._renewer = asyncio.ensure_future(owner.renew_loop(key, token))

    def abandon(self) -> None:
        """Stop renewing without releasing (no await possible): the lease expires within its TTL."""
        self._renewer.cancel()

    async def release(self, *, stored: bool) -> None:
        self._renewer.cancel()
        await self._owner.release(self.key, self._token, stored=stored)


class Leases:
    def __init__(
        self, client: aioredis.Redis, settings: LeaseSettings, counter: Counter, clock: Callable[[], float]
    ) -> None:
        self._client = client
        self._settings = settings
        self._counter = counter
        self._clock = clock
        self._waiters: dict[str, list[asyncio.Future[bool]]] = {}
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._renew = client.register_script(_RENEW)
        self.subscribed = asyncio.Event()

    def count(self, outcome: str) -> None:
        self._counter.labels(outcome).inc()

    async def acquire_or_wait(self, key: str, read: Reader) -> Entry | Lease | None:
        """An entry another replica stored, a lease to fill the key ourselves, or None: go upstream unleased."""
        started = self._clock()
        deadline = time.monotonic() + self._settings.max_wait_s
        ttl_ms = max(1, int(self._settings.ttl_s * 1000))
        while True:
            woken = self._wait_for(key)  # registered before the attempt, so no release can slip between them
            try:
                token = secrets.token_hex(8)
                answer = int(
                    await self._redis(self._acquire(keys=[LEASE_PREFIX + key], args=[token, ttl_ms]))
                )
                if answer == ACQUIRED:
                    return await self._acquired(key, token, read, started)
                self.count("wait")
                left = deadline - time.monotonic()
                if left <= 0:
                    self.count("timeout")
                    return None
                wait_s = min(
                    left, answer / 1000 if answer > 0 else self._settings.ttl_s, self._settings.ttl_s
                )
                stored = await self._wake(woken, wait_s)
            except LEASE_FAILURES as exc:
                self.count("error")
                log.warning("lease on %s degraded to no lease: %s", key, exc)
                return None
            finally:
                self._forget(key, woken)
            if stored is False:
                self.count("not-stored")
                return None  # the holder's answer was not cacheable: ours may be, and it is not shared
            entry = await self._fresh(read, started)
            if entry is not None:
                self.count("entry")
                return entry

    async def _acquired(self, key: str, token: str, read: Reader, started: float) -> Entry | Lease:
        lease = Lease(self, key, token)
        try:
            entry = await self._fresh(
                read, started
            )  # a holder may have stored and released just before we asked
        except BaseException:
            lease.abandon()  # cancelled here: stop renewing, so the lease lapses within one TTL
            raise
        if entry is not None:
            await lease.release(stored=True)
            self.count("entry")
            return entry
        self.count("acquired")
        return lease

    async def _fresh(self, read: Reader, started: float) -> Entry | None:
        entry = await read()
        if entry is None or entry.created_at < started - CLOCK_SLACK_S:
            return None  # an older entry was already refused by the lookup (stale, max-age, no-cache)
        return entry if entry.age_s(self._clock()) <= entry.ttl_s else None

    @staticmethod
    async def _wake(woken: asyncio.Future[bool], wait_s: float) -> bool | None:
        """True / False: the holder released (stored or not); None: the wait ran out (re-check the lease)."""
        if wait_s <= 0:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(woken), wait_s)
        except TimeoutError:
            return None

    async def _redis(self, call: Awaitable[Any]) -> Any:
        return await asyncio.wait_for(call, self._settings.timeout_s)

    async def release(self, key: str, token: str, *, stored: bool) -> None:
        message = ("1" if stored else "0") + key
        try:
            await self._redis(self._release(keys=[LEASE_PREFIX + key], args=[token, CHANNEL, message]))
        except LEASE_FAILURES as exc:
            self.count("error")  # the lease expires by itself; waiters find the entry when it does
            log.warning("lease release on %s failed: %s", key, exc)

    async def renew_loop(self, key: str, token: str) -> None:
        ttl_ms = max(1, int(self._settings.ttl_s * 1000))
        while True:
            await asyncio.sleep(self._settings.ttl_s / 3)
            try:
                if not int(await self._redis(self._renew(keys=[LEASE_PREFIX + key], args=[token, ttl_ms]))):
                    return  # lost (expired under a stall): another replica may fill too; harmless, just wasteful
            except LEASE_FAILURES:
                self.count("error")

    def _wait_for(self, key: str) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(future)
        return future

    def _forget(self, key: str, future: asyncio.Future[bool]) -> None:
        waiters = self._waiters.get(key)
        if waiters is not None:
            with contextlib.suppress(ValueError):
                waiters.remove(future)
            if not waiters:
                del self._waiters[key]

    def deliver(self, message: bytes) -> None:
        """One release announcement from the channel: wake this process's waiters on that key."""
        text = message.decode(errors="replace")
        stored, key = text[:1] == "1", text[1:]
        for future in self._waiters.pop(key, ()):
            if not future.done():
                future.set_result(stored)

    async def listen(self, clients: list[aioredis.Redis]) -> None:
        """The subscription, re-established after any error (on the next node given); meanwhile waits poll PTTL."""
        attempt = 0
        while True:
            client = clients[attempt % len(clients)]
            attempt += 1
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    self.subscribed.set()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self.deliver(message["data"])
            except REDIS_FAILURES as exc:
                self.subscribed.clear()
                log.warning("lease channel lost (%s); waits poll until it is back", exc)
                await asyncio.sleep(self._settings.ttl_s / max(1, len(clients)))
