"""L2 on a Redis Cluster: `cache.redis_url = "redis+cluster://host:port[,host:port...]"` (any reachable nodes).

The layout is the single-node one (gateway/tiers/redis_tier.py), spread over the cluster's 16384 slots: an entry
`te1:{scope}:{digest}` hashes on its whole name (no hash tag), so entries spread evenly over the masters; each tag set
`te1:tag:{tag}` lands wherever its name hashes. Nothing here needs multi-key atomicity, so no hash tags are used:
- reads: a batch of lookups is one MGET per slot, sent as one pipeline per node (`mget_nonatomic`), so a batch costs
  one round trip per node holding one of its keys, in parallel;
- a store writes the entry and adds it to its tag sets in one non-transactional pipeline (one round trip per node
  involved), as on a single node;
- purge by tag is a documented fan-out: SMEMBERS of every tag set (pipelined per node), then DEL of the member keys
  per slot, then DEL of the tag sets. Like the single-node SUNION + DEL it is not atomic: an entry stored while a
  purge runs may survive it (the same window a single node has between the two commands);
- /metrics' L2 size sums DBSIZE and used_memory over the masters.
Failover: a dead master's slots fail fast (one short timeout) into the shared `Breaker`, so requests degrade to
L1 + upstream exactly as with a single Redis; the client re-reads the slot map on the next attempt and follows the
promoted replica. The lease channel (gateway/misses/lease.py) subscribes on one node at a time (plain PUBLISH reaches every
node of a cluster) and moves to the next startup node when that one is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.tiers.base import L2Unavailable
from gateway.tiers.redis_tier import TAG_PREFIX, RedisTier

# What a failed command of a `command_client` raises: redis-py's errors, and socket errors (TimeoutError among them)
REDIS_FAILURES: tuple[type[BaseException], ...] = (RedisError, OSError)
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


def _parts(url: str) -> tuple[bool, str | None, str | None, list[tuple[str, int]]]:
    """(tls, username, password, [(host, port)]) of `redis+cluster://[user:pass@]h1:p1,h2:p2[/...]`."""
    tls = url.startswith("rediss+")
    rest = url.split("://", 1)[1].split("/", 1)[0]
    username = password = None
    if "@" in rest:
        auth, rest = rest.rsplit("@", 1)
        user, _, secret = auth.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) or None)
    nodes = []
    for item in rest.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"cluster node must be host:port, got {item!r}")
        nodes.append((host, int(port)))
    return tls, username, password, nodes


def validate_cluster_url(url: str) -> None:
    """Raises ValueError naming the problem (used by config validation)."""
    _parts(url)


def node_urls(url: str) -> list[str]:
    """Plain single-node URLs of the startup nodes (for the lease channel's subscription)."""
    tls, username, password, nodes = _parts(url)
    auth = f"{username or ''}:{password}@" if password else ""
    return [f"{'rediss' if tls else 'redis'}://{auth}{host}:{port}/0" for host, port in nodes]


def cluster_client(url: str, *, timeout_s: float) -> RedisCluster:
    tls, username, password, nodes = _parts(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=username,
        password=password,
        ssl=tls,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(
            NoBackoff(), 1
        ),  # one retry after re-reading the slot map (MOVED, failover); then the breaker
        require_full_coverage=False,  # serve the slots that are up while a failover runs
        reinitialize_steps=1,  # re-read the slot map after every connection error (pipelines default to every 5th)
    )


def _total(value: object, field: str | None = None) -> int:
    """Sum a per-node reply ({node: value}) or pass an already aggregated one through."""
    if isinstance(value, dict) and (field is None or field not in value):
        items = list(value.values())
    else:
        items = [value]
    return sum(int(i.get(field, 0)) if field is not None else int(i or 0) for i in items)


class RedisClusterTier(RedisTier):
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        retry_after_s: float,
        clock: Callable[[], float],
        on_error: Callable[[], None],
    ) -> None:
        self._cluster = cluster_client(url, timeout_s=timeout_s)
        super().__init__(
            url,
            timeout_s=timeout_s,
            retry_after_s=retry_after_s,
            clock=clock,
            on_error=on_error,
            client=self._cluster,  # type: ignore[arg-type]
        )

    async def _mget(self, keys: list[str]) -> list[bytes | str | None]:
        return list(await self._cluster.mget_nonatomic(keys))

    async def delete(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        return int(await self._call("delete", lambda: self._cluster.delete(*keys)))  # DEL per slot

    async def purge_tags(self, tags: Iterable[str]) -> tuple[int, list[str]]:
        tag_keys = [TAG_PREFIX + t for t in tags]
        if not tag_keys:
            return 0, []

        async def purge() -> tuple[int, list[str]]:
            pipe = self._cluster.pipeline()
            for tag_key in tag_keys:
                pipe.smembers(tag_key)
            members = set().union(*(await pipe.execute()))
            keys = sorted(m.decode() if isinstance(m, bytes) else m for m in members)
            deleted = int(await self._cluster.delete(*keys)) if keys else 0
            await self._cluster.delete(*tag_keys)
            return deleted, keys

        return await self._call("purge", purge)

    async def ping(self) -> bool:
        try:
            return bool(
                await self._call("ping", lambda: self._cluster.ping(target_nodes=RedisCluster.PRIMARIES))
            )
        except L2Unavailable:
            return False

    async def stats(self) -> tuple[int, int] | None:
        try:
            size = await self._call(
                "dbsize", lambda: self._cluster.dbsize(target_nodes=RedisCluster.PRIMARIES)
            )
            info = await self._call(
                "info", lambda: self._cluster.info("memory", target_nodes=RedisCluster.PRIMARIES)
            )
        except L2Unavailable:
            return None
        return _total(size), _total(info, "used_memory")


def command_client(url: str, *, timeout_s: float) -> aioredis.Redis:
    """A client for commands and scripts on `url`: a cluster client for a `redis+cluster://` URL, else a plain one.
    RedisCluster is not a subclass of Redis but answers the commands these callers send."""
    if is_cluster_url(url):
        return cluster_client(url, timeout_s=timeout_s)  # type: ignore[return-value]
    return aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def subscriber_clients(url: str, *, timeout_s: float) -> list[aioredis.Redis]:
    """One plain client per startup node for the lease channel (a single node's URL gives one client)."""
    urls = node_urls(url) if is_cluster_url(url) else [url]
    return [aioredis.Redis.from_url(u, socket_connect_timeout=timeout_s) for u in urls]
