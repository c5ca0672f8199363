"""L2 on a Redis Cluster: `cache.redis_url = "redis+cluster://host:port[,host:port...]"` (any reachable nodes).

The layout is the single-node one (gateway/tiers/redis_tier.py) cut into `BUCKETS` buckets, each a hash tag and so
one slot: a key's bucket is fixed by its name (CRC-32), and its entry `te1:{bN}:{key}`, its tag sets
`te1:tag:{bN}:{tag}` and its purge epoch `te1:epoch:{bN}` all live in that slot. So the single-node scripts run
unchanged per bucket (a Lua script may only touch one slot):
- reads: a batch of lookups is one MGET per slot, sent as one pipeline per node (`mget_nonatomic`), so a batch costs
  one round trip per node holding one of its keys, in parallel;
- a store is one script in its bucket: written and indexed only while the bucket's epoch holds (P2);
- a purge by key is one script per bucket named; a purge by tag is one script per bucket (`BUCKETS` scripts,
  pipelined per node): each bumps the bucket's epoch and deletes that bucket's members and tag sets in one step
  (P1). Not one step over the whole cluster, but every entry lives in exactly one bucket, and a store in a bucket
  the purge already passed finds the epoch moved, so nothing stored before the purge survives it. The trade-off:
  `BUCKETS` slots spread entries over the masters less evenly than one slot per key (256 buckets over 3 masters
  with the default slot ranges: 80 / 83 / 93), and a tag purge costs `BUCKETS` small scripts;
- /metrics' L2 size sums DBSIZE and used_memory over the masters.
Failover: a dead master's slots fail fast (one short timeout) into the shared `Breaker`, so requests degrade to
L1 + upstream exactly as with a single Redis; the client re-reads the slot map on the next attempt and follows the
promoted replica. The lease channel (gateway/misses/lease.py) subscribes on one node at a time (plain PUBLISH reaches every
node of a cluster) and moves to the next startup node when that one is lost.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Callable
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.tiers.base import L2Unavailable
from gateway.tiers.redis_tier import EPOCH_KEY, PURGE_SCRIPT, TAG_PREFIX, RedisTier

BUCKETS = 256

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


def bucket_tag(key: str, buckets: int = BUCKETS) -> str:
    """The hash tag of a key's bucket: its entry, tag sets and purge epoch share that slot."""
    return f"{{b{zlib.crc32(key.encode()) % buckets}}}"


def stored_name(key: str, buckets: int = BUCKETS) -> str:
    """Where a key's entry lives on the cluster."""
    return f"te1:{bucket_tag(key, buckets)}:{key}"


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
        on_refusal: Callable[[str], None] = lambda reason: None,
        client: RedisCluster | None = None,
        buckets: int = BUCKETS,
    ) -> None:
        self._cluster = client if client is not None else cluster_client(url, timeout_s=timeout_s)
        self._buckets = buckets
        super().__init__(
            url,
            timeout_s=timeout_s,
            retry_after_s=retry_after_s,
            clock=clock,
            on_error=on_error,
            client=self._cluster,  # type: ignore[arg-type]
            on_refusal=on_refusal,
        )

    def _tag(self, key: str) -> str:
        return bucket_tag(key, self._buckets)

    def stored_name(self, key: str) -> str:
        return stored_name(key, self._buckets)

    def key_of(self, name: str) -> str:
        return name.split("}:", 1)[1]

    def epoch_key(self, key: str) -> str:
        return f"{EPOCH_KEY}:{self._tag(key)}"

    def tag_key(self, key: str, tag: str) -> str:
        return f"{TAG_PREFIX}{self._tag(key)}:{tag}"

    def _every_bucket(self, tags: list[str]) -> dict[str, list[str]]:
        tagged = [f"{{b{b}}}" for b in range(self._buckets)]
        return {f"{EPOCH_KEY}:{t}": [f"{TAG_PREFIX}{t}:{tag}" for tag in tags] for t in tagged}

    async def _purged(self, op: str, kind: str, buckets: dict[str, list[str]]) -> tuple[int, list[str]]:
        """P1 per bucket: one script each, pipelined per node (the script is loaded on every master first)."""
        if not buckets:
            return 0, []
        start = str(secrets.randbits(48) + 1)

        async def purge() -> list[list[object]]:
            sha = await self._cluster.script_load(PURGE_SCRIPT)
            pipe = self._cluster.pipeline()
            for epoch, names in buckets.items():
                # redis-py refuses `pipe.evalsha` on a cluster; the command itself is routed by its first key
                pipe.execute_command("EVALSHA", sha, 1 + len(names), epoch, *names, kind, start)
            return list(await pipe.execute())

        return self._counted(await self._call(op, purge))

    async def _mget(self, keys: list[str]) -> list[bytes | str | None]:
        return list(await self._cluster.mget_nonatomic([self.stored_name(key) for key in keys]))

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
