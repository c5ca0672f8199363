"""Invalidations over Redis pub/sub: one channel for every worker and every replica on the same Redis.

Plain pub/sub, not RESP3 client-side caching: tracking invalidates *Redis keys* a client has read, but our L1 is
filled from L2 and also from upstream answers whose keys this process never read from Redis, and purge by tag,
tenant or model names no single Redis key; one explicit message per purge says exactly what to drop.

Pub/sub is at-most-once: a subscriber that is disconnected misses messages for good. So the subscriber reports
`down()` as soon as the connection fails or stops answering pings (the receiver then empties and stops using its
L1), and `up()` only after a fresh SUBSCRIBE is confirmed (the receiver empties L1 once more, since anything
published in between is lost). Receivers are told about every message; the publisher applies its own first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.ops.ratelog import RateLimitedLog
from gateway.tiers.coherence.bus import BusUnavailable, Receiver
from gateway.tiers.redis_cluster import REDIS_FAILURES

log = logging.getLogger("tokenedge.bus")
CHANNEL = "te1:invalidate"
ACK_CHANNEL = "te1:invalidate:ack"
_MAX_BACKOFF_S = 1.0


class RedisBus:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        ping_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` measures liveness (real elapsed time, not the cache's wall clock)."""
        self._pub = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        # No socket timeout on the subscriber: it is idle by design; liveness is the ping below.
        self._sub = aioredis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0), health_check_interval=0
        )
        self._timeout_s = timeout_s
        self._ping_interval_s = ping_interval_s
        self._clock = clock
        self._log = RateLimitedLog(log, 10.0, clock)
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def start(self, receiver: Receiver) -> None:
        self._task = asyncio.ensure_future(self._run(receiver))
        try:  # a Redis that is down at startup only delays L1: the receiver stays down until subscribed
            await asyncio.wait_for(self._subscribed.wait(), self._timeout_s * 4)
        except TimeoutError:
            self._log.warning("bus", "invalidation bus not subscribed yet; L1 stays off until it is")

    async def publish(self, raw: bytes) -> int:
        try:
            return int(await asyncio.wait_for(self._pub.publish(CHANNEL, raw), self._timeout_s * 4))
        except REDIS_FAILURES as exc:
            raise BusUnavailable(f"publish failed: {type(exc).__name__}: {exc}") from exc

    async def ack(self, raw: bytes) -> None:
        try:
            await asyncio.wait_for(self._pub.publish(ACK_CHANNEL, raw), self._timeout_s * 4)
        except REDIS_FAILURES as exc:
            self._log.warning("ack", "invalidation ack not sent: %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._pub.aclose()
        await self._sub.aclose()

    async def _run(self, receiver: Receiver) -> None:
        backoff_s = 0.02
        while True:
            pubsub = self._sub.pubsub()
            try:
                await asyncio.wait_for(pubsub.subscribe(CHANNEL, ACK_CHANNEL), self._timeout_s * 4)
                await self._confirmed(pubsub)
                receiver.up()
                self._subscribed.set()
                backoff_s = 0.02
                await self._listen(pubsub, receiver)
            except REDIS_FAILURES as exc:
                self._log.warning(
                    "sub",
                    "invalidation subscription lost, L1 off until back: %s: %s",
                    type(exc).__name__,
                    exc,
                )
            finally:
                receiver.down()
                self._subscribed.clear()
                await _close_quietly(pubsub)
            await asyncio.sleep(backoff_s)  # reconnect pacing, not synchronisation: L1 is off meanwhile
            backoff_s = min(backoff_s * 2, _MAX_BACKOFF_S)

    async def _confirmed(self, pubsub: aioredis.client.PubSub) -> None:
        """Wait for both SUBSCRIBE replies: only from then on is every published message delivered to us."""
        deadline = self._clock() + self._timeout_s * 4
        confirmed = 0
        while self._clock() < deadline:
            msg = await pubsub.get_message(timeout=self._timeout_s)
            if msg is not None and msg.get("type") == "subscribe":
                confirmed += 1
                if confirmed == 2:
                    return
        raise TimeoutError("no SUBSCRIBE confirmation")

    async def _listen(self, pubsub: aioredis.client.PubSub, receiver: Receiver) -> None:
        """Deliver messages; ping when idle, and give up (-> down) when the server stops answering."""
        last_heard = self._clock()
        while True:
            msg = await pubsub.get_message(timeout=self._ping_interval_s)
            now = self._clock()
            if msg is None:
                if now - last_heard > 3 * self._ping_interval_s:
                    raise TimeoutError(f"no reply from Redis for {now - last_heard:.1f} s")
                await pubsub.ping()
                continue
            last_heard = now
            if msg.get("type") == "message" and isinstance(msg.get("data"), bytes):
                receiver.message(msg["data"])


async def _close_quietly(pubsub: aioredis.client.PubSub) -> None:
    with contextlib.suppress(*REDIS_FAILURES):
        await pubsub.aclose()
