"""Builds the tiers the config asks for: L1 always, L2 on Redis or Memcached (`cache.l2`), or no L2.

With Memcached as L2 there is no cross-worker invalidation channel (the invalidation bus rides on Redis), so
L1 entries are capped at `cache.memcached_l1_max_age_s` (0 turns L1 off): that cap bounds how long a purge made
through another worker can go unseen in this worker's L1.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.config.settings import CacheConfig
from gateway.ops.metrics import GatewayMetrics
from gateway.tiers.base import Tier
from gateway.tiers.memcached_tier import MemcachedTier
from gateway.tiers.memory import MemoryTier
from gateway.tiers.redis_cluster import RedisClusterTier, is_cluster_url
from gateway.tiers.redis_tier import RedisTier


def build_l1(config: CacheConfig, clock: Callable[[], float]) -> MemoryTier:
    if config.l2_kind == "memcached":
        max_age_s = config.memcached_l1_max_age_s
        return MemoryTier(config.l1_max_bytes if max_age_s > 0 else 0, clock, max_age_s=max_age_s)
    return MemoryTier(config.l1_max_bytes, clock)


def build_l2(config: CacheConfig, metrics: GatewayMetrics, clock: Callable[[], float]) -> Tier | None:
    errors = metrics.cache_errors.labels("l2")

    def refused(reason: str) -> None:
        metrics.cache_refusals.labels("l2", reason).inc()

    kind = config.l2_kind
    if kind == "redis":
        redis_tier = RedisClusterTier if is_cluster_url(config.redis_url) else RedisTier
        return redis_tier(
            config.redis_url,
            timeout_s=config.redis_timeout_s,
            retry_after_s=config.redis_retry_after_s,
            clock=clock,
            on_error=errors.inc,
            on_refusal=refused,
        )
    if kind == "memcached":
        return MemcachedTier(
            config.memcached_servers,
            timeout_s=config.memcached_timeout_s,
            retry_after_s=config.memcached_retry_after_s,
            max_item_bytes=config.memcached_max_item_bytes,
            clock=clock,
            on_error=errors.inc,
            on_refusal=refused,
        )
    return None
