"""The upstream's model catalog: `GET /v1/models`, cached briefly, and the model revisions that go into every key.

A revision comes from the upstream (`data[].tokenedge.revision` from a tokenedge backend, or `data[].revision`),
else from `upstream.model_revision` in config, else "unversioned". When the catalog is older than its TTL it is
refreshed in the background while the last known revisions keep serving, and an upstream outage keeps the last
known revisions rather than inventing new keys.

Revisions are also learned without polling: from the revision header on upstream answers (`learn`, called by the
fill on a miss), from the co-deployed backend's revision event stream (`gateway.tiers.coherence.revisions`), and from
other processes over the invalidation bus. A change is reported to `listener` (which drops the old revision's L1
entries and tells the other processes). While a push stream that was live is down, the revision is unconfirmed:
every lookup first asks `/v1/models` (one request in flight, shared), so a restarted backend's new revision is
used from its first answer on, not after a reconnect delay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import TTLCache

from gateway.ops.ratelog import RateLimitedLog
from gateway.upstream.http import UpstreamResponse
from gateway.upstream.transport import UpstreamTransport
from gateway.web.errors import UpstreamError

log = logging.getLogger("tokenedge.catalog")
UNVERSIONED = "unversioned"
REVISION_HEADER = "X-Tokenedge-Revision"  # on every co-deployed backend answer: the revision that made it
RevisionListener = Callable[[str, str | None, str], None]  # (model, old revision or None, new revision)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    revision: str
    max_model_len: int | None = None
    tokenizer: str | None = None
    transports: tuple[str, ...] = ("json",)
    seeded_invariant: bool = False  # `tokenedge.seeded_invariant`: a seed repeats its draw whatever the batch


def parse_models(body: bytes) -> dict[str, ModelInfo]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    data = doc.get("data") if isinstance(doc, dict) else None
    out: dict[str, ModelInfo] = {}
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        extra: Any = item.get("tokenedge") if isinstance(item.get("tokenedge"), dict) else {}
        revision = extra.get("revision") or item.get("revision")
        if isinstance(revision, str) and revision:
            max_len = extra.get("max_model_len")
            transports = extra.get("transports")
            out[item["id"]] = ModelInfo(
                revision=revision,
                max_model_len=max_len if isinstance(max_len, int) else None,
                tokenizer=extra.get("tokenizer") if isinstance(extra.get("tokenizer"), str) else None,
                transports=tuple(transports) if isinstance(transports, list) else ("json",),
                seeded_invariant=extra.get("seeded_invariant") is True,
            )
    return out


class ModelCatalog:
    def __init__(
        self, upstream: UpstreamTransport, *, ttl_s: float, fallback_revision: str, clock: Callable[[], float]
    ) -> None:
        self._upstream = upstream
        self._ttl_s = ttl_s
        self._fallback = fallback_revision or UNVERSIONED
        self._clock = clock
        self._models: dict[str, ModelInfo] = {}
        self._fetched_at: float | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._responses: TTLCache[str, UpstreamResponse] = TTLCache(
            maxsize=4096, ttl=max(ttl_s, 1e-9), timer=clock
        )
        self.listener: RevisionListener | None = None
        # Many backends (gateway.upstream.routing.book): may this revision become the key revision? None: always.
        self.arbiter: Callable[[str, str], bool] | None = None
        self._log = RateLimitedLog(log, 10.0, clock)  # while a push stream is down, every lookup may ask
        self.push_live = False  # the upstream's revision stream is connected: its revisions need no polling
        self.push_seen = False  # it pushed at least once: when the stream drops, revisions are unconfirmed

    def learn(self, model: str, revision: str, *, notify: bool = True) -> bool:
        """Record `model`'s current revision; True (and the listener told, when `notify`) when it changed."""
        info = self._models.get(model)
        if info is not None and info.revision == revision:
            return False
        if self.arbiter is not None and not self.arbiter(model, revision):
            return False  # an answer from a backend still at an older revision: the key keeps the current one
        self._models = {
            **self._models,
            # A new revision may be served by another engine: its promises hold again only once /v1/models says so.
            model: dataclasses.replace(info, revision=revision, seeded_invariant=False)
            if info
            else ModelInfo(revision=revision),
        }
        self._responses.clear()  # a cached /v1/models body would still name the old revision
        self._fetched_at = None  # the rest of the model's details (tokenizer, ...) may have changed: ask once
        if notify and self.listener is not None:
            self.listener(model, info.revision if info else None, revision)
        return True

    def _replace_models(self, models: dict[str, ModelInfo]) -> None:
        old, self._models = self._models, models
        if self.listener is None:
            return
        for model, info in models.items():
            before = old.get(model)
            if before is not None and before.revision != info.revision:
                self.listener(model, before.revision, info.revision)

    @property
    def known(self) -> Mapping[str, ModelInfo]:
        return self._models

    def cached_revision(self, model: str) -> str:
        """The revision known right now, without contacting the upstream (used by /v1/cache/explain)."""
        info = self._models.get(model)
        return info.revision if info else self._fallback

    def fresh_revision(self, model: str) -> str | None:
        """The revision when the catalog is fresh (the hot path: no await, no headers); None means ask."""
        if self.push_live and self._fetched_at is not None:
            return self.cached_revision(model)
        if self.push_seen or self._fetched_at is None or self._clock() - self._fetched_at >= self._ttl_s:
            return None
        return self.cached_revision(model)

    async def info(self, model: str, headers: Mapping[str, str]) -> ModelInfo | None:
        await self._ensure_fresh(headers)
        return self._models.get(model)

    async def seeded_invariant(self, model: str, headers: Mapping[str, str]) -> bool:
        """Does the upstream promise batch-invariant seeded sampling for `model`? False when it does not say."""
        info = await self.info(model, headers)
        return info is not None and info.seeded_invariant

    async def revision(self, model: str, headers: Mapping[str, str]) -> str:
        if self.push_seen and not self.push_live:
            await self._confirm(headers)
        else:
            await self._ensure_fresh(headers)
        return self.cached_revision(model)

    async def _confirm(self, headers: Mapping[str, str]) -> None:
        """The push stream is down: ask the upstream now (sharing a request already in flight)."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._fetch(dict(headers)))
        await asyncio.shield(self._refresh)

    async def _ensure_fresh(self, headers: Mapping[str, str]) -> None:
        now = self._clock()
        if self._fetched_at is not None and now - self._fetched_at < self._ttl_s:
            return
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._fetch(dict(headers)))
        if self._fetched_at is None:
            await asyncio.shield(self._refresh)  # first contact: wait; afterwards refresh in the background

    async def _fetch(self, headers: dict[str, str]) -> None:
        try:
            resp = await self._upstream.request("GET", "/v1/models", headers)
        except UpstreamError as exc:
            self._log.warning(
                "fetch", "model catalog refresh failed, keeping last known revisions: %s", exc.message
            )
            if self._fetched_at is None:
                self._fetched_at = self._clock() - self._ttl_s + 1.0  # retry within a second, not per request
            return
        if resp.status == 200:
            self._replace_models(parse_models(resp.body))
            self._fetched_at = self._clock()
        elif self._fetched_at is None:
            self._fetched_at = self._clock() - self._ttl_s + 1.0

    async def models_response(self, scope: str, headers: Mapping[str, str]) -> UpstreamResponse:
        """`GET /v1/models` for a client: cached per scope for the catalog TTL (lists may differ per key)."""
        cached = self._responses.get(scope)
        if cached is not None:
            return cached
        resp = await self._upstream.request("GET", "/v1/models", headers)
        if resp.status == 200:
            self._responses[scope] = resp
            self._replace_models(parse_models(resp.body) or self._models)
            self._fetched_at = self._clock()
        return resp
