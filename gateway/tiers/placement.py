"""The router's shared placement (gateway/upstream/routing/share.py) in the deployment's Redis: the store it reads
and writes, built only when the L2 is Redis (single node or Cluster) and `upstream.share_placement` is on.

A read is one MGET (the keys of one lookup share a hash tag: one slot), a write one pipeline of SET PX, not a
transaction (each key stands alone). Redis errors are wrapped as `share.StoreError`, which turns sharing off for a
while; nothing here retries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis

from gateway.config.sections import CacheConfig
from gateway.config.upstream import UpstreamConfig
from gateway.tiers.redis_cluster import REDIS_FAILURES, command_client
from gateway.upstream.routing.share import StoreError


class RedisPlacement:
    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client

    async def read(self, keys: Sequence[str]) -> list[bytes | None]:
        try:
            values = await self._client.mget(list(keys))
        except REDIS_FAILURES as exc:
            raise StoreError(str(exc)) from exc
        return [v.encode() if isinstance(v, str) else v for v in values]

    async def write(self, items: Mapping[str, bytes], ttl_s: float) -> None:
        ttl_ms = max(1, int(ttl_s * 1000))
        try:
            pipe = self._client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(key, value, px=ttl_ms)
            await pipe.execute()
        except REDIS_FAILURES as exc:
            raise StoreError(str(exc)) from exc

    async def close(self) -> None:
        with contextlib.suppress(*REDIS_FAILURES):
            await self._client.aclose()


def placement_store(cache: CacheConfig, upstream: UpstreamConfig) -> RedisPlacement | None:
    """The store, or None: several backends, a Redis L2 and `share_placement` are all needed."""
    if len(upstream.targets) < 2 or not upstream.share_placement or cache.l2_kind != "redis":
        return None
    return RedisPlacement(command_client(cache.redis_url, timeout_s=cache.redis_timeout_s))
