"""The hot-key record: a bounded, decayed popularity count of cache keys in Redis, for warm-up (gateway/misses/warm.py).

Why it is cheap: a hit or a store only bumps a counter in a local dict (no await, no Redis command, no JSON), so
neither the L1 nor the L2 hit path pays a round trip (tests/gateway/test_hot_path.py counts them). The local counts
are flushed in one Lua call per batch (`cache.hot_record_batch` distinct keys) or per `cache.hot_record_flush_s`,
from a background task. In Redis (one hash tag, so one Redis Cluster slot):
- `te1:{hot}:scores`, a sorted set key -> decayed count: on a flush, when a half-life has passed since the last
  decay, every score is multiplied by 0.5^(elapsed / half-life) (ZUNIONSTORE with WEIGHTS), so the record follows
  what is hot now; then it is trimmed to the `cache.hot_record_max_keys` highest;
- `te1:{hot}:requests`, a hash key -> the request that filled it (versioned record, at most
  `cache.hot_record_max_request_bytes` each), trimmed with the scores. Only requests the gateway may re-ask on its
  own are kept: `pub` scope (public routes) and `anon` scope (no caller credential; the operator's
  `upstream.api_key`, if any, serves them). A tenant-scoped request is never written down: re-asking it needs the
  tenant's credential, which the gateway does not keep, and its body is that tenant's data.
A Redis error during a flush drops that batch (counted in `tokenedge_hot_record_flushes_total{outcome="error"}`):
the record is a hint for warm-up, never a source of answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis
from prometheus_client import Counter

from gateway.keys.derive import ANONYMOUS_SCOPE, PUBLIC_SCOPE
from gateway.ops.ratelog import RateLimitedLog
from gateway.tiers.redis_cluster import REDIS_FAILURES

log = logging.getLogger("tokenedge.hotrecord")
SCORES = "te1:{hot}:scores"
REQUESTS = "te1:{hot}:requests"
DECAYED_AT = "te1:{hot}:decayed_at"
RECORD_VERSION = 1
REPLAYABLE_SCOPES = frozenset({PUBLIC_SCOPE, ANONYMOUS_SCOPE})

# KEYS scores, requests, decayed_at. ARGV now_ms, half_life_ms, max_keys, n, then n (member, increment) pairs, then
# (member, request) pairs. Returns how many members were trimmed.
_FLUSH = """
local now, half, maxk, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local last = tonumber(redis.call('get', KEYS[3]) or '')
if last == nil then
  redis.call('set', KEYS[3], ARGV[1])
elseif now - last >= half then
  redis.call('zunionstore', KEYS[1], 1, KEYS[1], 'weights', tostring(math.pow(0.5, (now - last) / half)))
  redis.call('set', KEYS[3], ARGV[1])
end
for i = 0, n - 1 do redis.call('zincrby', KEYS[1], ARGV[6 + 2 * i], ARGV[5 + 2 * i]) end
for j = 5 + 2 * n, #ARGV, 2 do redis.call('hset', KEYS[2], ARGV[j], ARGV[j + 1]) end
local extra = redis.call('zcard', KEYS[1]) - maxk
if extra > 0 then
  local gone = redis.call('zrange', KEYS[1], 0, extra - 1)
  redis.call('zremrangebyrank', KEYS[1], 0, extra - 1)
  for _, member in ipairs(gone) do redis.call('hdel', KEYS[2], member) end
  return extra
end
return 0
"""


@dataclass(slots=True)
class Warmup:
    """A replica's start-up L1 fill from this record (`gateway.misses.warm`): `/ready` waits on `done`."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: str = "pending"  # pending | filled | timeout | error
    filled: int = 0


@dataclass(frozen=True, slots=True)
class HotSettings:
    max_keys: int
    batch: int
    flush_s: float
    half_life_s: float
    max_request_bytes: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Replayable:
    """A recorded request the gateway can send again: where to, the bytes, and the revision it was answered by."""

    key: str
    endpoint: str
    path: str
    model: str
    revision: str
    body: bytes


def encode_request(req: Replayable) -> bytes:
    return orjson.dumps(
        {
            "v": RECORD_VERSION,
            "key": req.key,
            "endpoint": req.endpoint,
            "path": req.path,
            "model": req.model,
            "revision": req.revision,
            "body": req.body.decode(),
        }
    )


def decode_request(raw: bytes | str | None) -> Replayable | None:
    """The recorded request; None when absent, unreadable or of an unknown record version."""
    if raw is None:
        return None
    try:
        doc = orjson.loads(raw)
        if not isinstance(doc, dict) or doc.get("v") != RECORD_VERSION:
            return None
        return Replayable(
            str(doc["key"]),
            str(doc["endpoint"]),
            str(doc["path"]),
            str(doc["model"]),
            str(doc["revision"]),
            str(doc["body"]).encode(),
        )
    except (orjson.JSONDecodeError, KeyError, UnicodeEncodeError):
        return None


class HotRecord:
    """Local batches of hits and stores, flushed to the shared record; reads for warm-up."""

    def __init__(
        self, client: aioredis.Redis, settings: HotSettings, clock: Callable[[], float], flushes: Counter
    ) -> None:
        self._client = client
        self._settings = settings
        self._clock = clock
        self._flushes = flushes
        self._counts: dict[str, int] = {}
        self._requests: dict[str, bytes] = {}
        self._flushing: asyncio.Task[None] | None = None
        self._script = client.register_script(_FLUSH)
        # While Redis is down every batch fails (a full batch per few ms under load): one line per interval.
        self._log = RateLimitedLog(log, 10.0, clock)

    def hit(self, key: str) -> None:
        """Count one access (no I/O); a full batch starts a background flush."""
        counts = self._counts
        if key in counts:
            counts[key] += 1
            return
        if len(counts) >= 4 * self._settings.batch:
            return  # Redis is slower than the traffic: drop new keys rather than grow without bound
        counts[key] = 1
        if len(counts) >= self._settings.batch:
            self._kick()

    def stored(self, req: Replayable, scope: str) -> None:
        """A store counts as an access; the request itself is kept only when the gateway may re-ask it."""
        if (
            scope in REPLAYABLE_SCOPES
            and len(req.body) <= self._settings.max_request_bytes
            and len(self._requests) < 4 * self._settings.batch
        ):
            self._requests[req.key] = encode_request(req)
        self.hit(req.key)

    def _kick(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self.flush())

    async def flush(self) -> None:
        """Send the pending batch in one script call; on a Redis error the batch is dropped (counted)."""
        counts, requests = self._counts, self._requests
        if not counts and not requests:
            return
        self._counts, self._requests = {}, {}
        args: list[bytes | str | int | float] = [
            int(self._clock() * 1000),
            max(1, int(self._settings.half_life_s * 1000)),
            self._settings.max_keys,
            len(counts),
        ]
        for key, count in counts.items():
            args += [key, count]
        for key, raw in requests.items():
            args += [key, raw]
        try:
            await asyncio.wait_for(
                self._script(keys=[SCORES, REQUESTS, DECAYED_AT], args=args), self._settings.timeout_s
            )
        except REDIS_FAILURES as exc:
            self._flushes.labels("error").inc()
            self._log.warning("flush", "hot-key record flush dropped %d keys: %s", len(counts), exc)
            return
        self._flushes.labels("ok").inc()

    async def run(self) -> None:
        """The periodic flush, so a quiet replica's few hits still reach the record."""
        while True:
            await asyncio.sleep(self._settings.flush_s)
            await self.flush()

    async def top(self, n: int) -> list[str]:
        """The n hottest keys, hottest first."""
        if n <= 0:
            return []
        raw = await self._client.zrevrange(SCORES, 0, n - 1)
        return [k.decode() if isinstance(k, bytes) else str(k) for k in raw]

    async def requests(self, keys: Sequence[str]) -> list[Replayable | None]:
        if not keys:
            return []
        raws = await self._client.hmget(REQUESTS, list(keys))
        return [decode_request(raw) for raw in raws]
