"""Placement shared across workers and replicas: which engine each prefix went to, through the deployment's Redis.

Each gateway process routes with its own affinity table (`affinity`), so without sharing, a second worker or replica
places every prefix again on its own (a group's first request there may pick the other engine: its prompt is
prefilled twice, and the group's later requests split between two homes). Here every placement is also published to
the shared tier, and a miss whose prompt reaches deeper than this process knows asks the shared tier first:

- Keys: `te1:place:{<chain root>}:<block hash>` -> `<backend name> <ms since epoch>`, for the chain's checkpoint depths
  only (`affinity.checkpoints`: every block below 16, then 8 per doubling), with a short TTL
  (`upstream.placement_ttl_s`). The chain hashes are the same in every process (`affinity`); the hash tag is the
  chain's first block, so one lookup reads one Redis Cluster slot, and different prompts spread over slots.
- Writes are batched and never awaited by a request: `publish` queues them and one flush at a time sends the queue
  (a pipeline of SET PX); a checkpoint this process already published for the same engine within half the TTL is
  not sent again, so a hot system prompt costs one write per half TTL, not one per request.
- A read is one MGET of the checkpoints deeper than this process's own longest match; the request waits for it at
  most `upstream.placement_wait_s` (a late answer still teaches the table, for the next request). What it finds is
  recorded in the local table as another process's placement; an entry older than its engine's last ejection seen
  here is ignored (the engine may have come back empty).
- A failure (error or timeout) turns sharing off for `cache.redis_retry_after_s`: routing goes on with the local
  table alone, as it does without Redis, and the failure is counted (`tokenedge_routing_placement_total`).

Why the shared tier and not the engines' own reports: llama-server reports no prefix index (its `/slots` shows one
prompt per slot, its host-memory prompt cache nothing), and vLLM's KV events hash token ids with its own tokenizer
and hash, which the gateway does not reproduce for text requests; the deployment's Redis is already there when there
are replicas to share with, and holds placements of every engine kind alike.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from prometheus_client import Counter

from gateway.upstream.routing.affinity import AffinityTable, checkpoints

KEY_PREFIX = "te1:place:"
SENT_MAX = 100_000  # checkpoints remembered as published (LRU), to skip repeats
_MASK = (1 << 64) - 1


class StoreError(Exception):
    """The shared tier did not answer (the store's own errors, wrapped)."""


class PlacementStore(Protocol):
    async def read(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def write(self, items: Mapping[str, bytes], ttl_s: float) -> None: ...

    async def close(self) -> None: ...


def key_of(root: int, block: int) -> str:
    return f"{KEY_PREFIX}{{{root & _MASK:016x}}}:{block & _MASK:016x}"


class SharedPlacement:
    def __init__(
        self,
        store: PlacementStore,
        names: Sequence[str],
        *,
        ttl_s: float,
        wait_s: float,
        retry_after_s: float,
        outcomes: Counter,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._index = {name: i for i, name in enumerate(names)}
        self._names = list(names)
        self._ttl_s, self._wait_s, self._retry_after_s = ttl_s, wait_s, retry_after_s
        self._outcomes = outcomes
        self._clock = clock
        self._sent: OrderedDict[int, tuple[int, float]] = OrderedDict()  # block hash -> (backend, when)
        self._pending: dict[str, bytes] = {}
        self._pending_hashes: list[int] = []
        self._flushing: asyncio.Task[None] | None = None
        self._off_until = 0.0  # after a failure: no reads or writes before this
        self._ejected_ms = [0] * len(names)  # each backend's last ejection seen here
        self._reads: set[asyncio.Task[None]] = set()

    def _on(self) -> bool:
        return self._clock() >= self._off_until

    def _failed(self, op: str, outcome: str) -> None:
        self._outcomes.labels(op, outcome).inc()
        self._off_until = self._clock() + self._retry_after_s

    def ejected(self, backend: int) -> None:
        """`backend` was ejected: placements published before now are not trusted for it."""
        self._ejected_ms[backend] = int(self._clock() * 1000)

    def publish(self, chain: Sequence[int], backend: int) -> None:
        """`chain` was sent to `backend`: queue its checkpoints (no I/O here) and start a flush if none runs."""
        now, sent = self._clock(), self._sent
        value = f"{self._names[backend]} {int(now * 1000)}".encode()
        for depth in checkpoints(len(chain)):
            h = chain[depth - 1]
            before = sent.get(h)
            if before is not None and before[0] == backend and now - before[1] < self._ttl_s / 2:
                continue
            sent[h] = (backend, now)
            sent.move_to_end(h)
            self._pending[key_of(chain[0], h)] = value
            self._pending_hashes.append(h)
        while len(sent) > SENT_MAX:
            sent.popitem(last=False)
        if self._pending and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.ensure_future(self.flush())

    async def flush(self) -> None:
        """Send what is queued, a batch at a time until nothing is; a batch is dropped on a failure (and forgotten
        as sent, so it goes again)."""
        while self._pending:
            items, hashes = self._pending, self._pending_hashes
            self._pending, self._pending_hashes = {}, []
            if not self._on():
                self._forget(hashes)
                self._outcomes.labels("write", "skipped").inc()
                continue
            try:
                await asyncio.wait_for(self._store.write(items, self._ttl_s), max(self._wait_s, 1.0))
            except (StoreError, TimeoutError):
                self._forget(hashes)
                self._failed("write", "error")
                continue
            self._outcomes.labels("write", "ok").inc()

    def _forget(self, hashes: list[int]) -> None:
        for h in hashes:
            self._sent.pop(h, None)

    async def learn(self, chain: Sequence[int], table: AffinityTable) -> None:
        """Record in `table` what the shared tier knows of `chain` beyond this process's own longest match,
        waiting for it at most `placement_wait_s`."""
        known = table.match(chain, range(len(self._names))).depth
        depths = [d for d in checkpoints(len(chain)) if d > known]
        if not depths:
            return
        if not self._on():
            self._outcomes.labels("read", "skipped").inc()
            return
        task = asyncio.ensure_future(self._read(chain, depths, table))
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)
        done, _ = await asyncio.wait({task}, timeout=self._wait_s)
        if not done:
            self._outcomes.labels("read", "late").inc()

    async def _read(self, chain: Sequence[int], depths: list[int], table: AffinityTable) -> None:
        keys = [key_of(chain[0], chain[d - 1]) for d in depths]
        try:
            values = await asyncio.wait_for(self._store.read(keys), max(self._wait_s, 1.0))
        except (StoreError, TimeoutError):
            self._failed("read", "error")
            return
        found = 0
        for depth, raw in zip(depths, values, strict=True):
            backend = self._parse(raw)
            if backend is not None:
                table.record(chain[:depth], backend, ends=False)
                found += 1
        self._outcomes.labels("read", "hit" if found else "miss").inc()

    def _parse(self, raw: bytes | None) -> int | None:
        """The backend a stored placement names, unless unknown here or older than its last ejection."""
        if raw is None:
            return None
        name, _, ms = raw.decode("utf-8", "replace").rpartition(" ")
        backend = self._index.get(name)
        if backend is None or not ms.isdigit() or int(ms) <= self._ejected_ms[backend]:
            return None
        return backend

    async def close(self) -> None:
        """Send what is queued (bounded), then stop."""
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self.flush()
        for task in list(self._reads):
            task.cancel()
        await asyncio.gather(*self._reads, return_exceptions=True)
        await self._store.close()
