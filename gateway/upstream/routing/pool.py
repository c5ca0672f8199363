"""`UpstreamPool`: many HTTP backends behind the one `UpstreamTransport` seam (fills, tees, relays, the catalog).

Per request: read the model and prompt chain (`facts`), narrow the backends to those serving the model at its
current revision (`book`) and not ejected (`breaker`), pick one (`choose`: prefix affinity, load-guarded, else
least outstanding per weight), and send. Retry rule: a failure before any byte can have reached the client (a
connect error, the backend dying before its response head, or, for `request`, before the whole body was read;
or a 502/503/504 head) is retried once on another backend. `open_stream` hands the head to the caller, which
relays the body as it arrives, so nothing after the head is ever retried. Every 5xx and transport failure counts
towards the backend's ejection; a successful answer closes a half-open circuit.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.config.sections import UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.catalog import REVISION_HEADER
from gateway.upstream.http import UpstreamResponse
from gateway.upstream.routing.affinity import NO_MATCH, AffinityTable
from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.book import RevisionBook, merge, only, served_models
from gateway.upstream.routing.choose import Candidate, choose
from gateway.upstream.routing.facts import Facts, facts_of
from gateway.web.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable

RETRY_STATUSES = frozenset({502, 503, 504})  # the backend could not answer: nothing was generated
MODELS_PATH = "/v1/models"


def retriable(exc: UpstreamError) -> bool:
    """Worth another backend: it could not be reached, or it died before answering whole. Not a read timeout:
    that backend may still be generating, and a second one would double the wait."""
    return not isinstance(exc, UpstreamTimeout) or isinstance(exc.__cause__, aiohttp.ConnectionTimeoutError)


class UpstreamPool:
    def __init__(
        self,
        config: UpstreamConfig,
        backends: list[Backend],
        metrics: RoutingMetrics,
    ) -> None:
        self.config = config
        self.backends = backends
        self.book = RevisionBook(len(backends))
        self.affinity = AffinityTable(config.affinity_table_blocks)
        self._metrics = metrics
        self._credit = [0.0] * len(
            backends
        )  # tie-breaks between equally loaded backends (`choose.least_loaded`)

    def facts(self, method: str, path_qs: str, body: bytes | None) -> Facts:
        c = self.config
        return facts_of(
            method,
            path_qs,
            body,
            block_chars=c.affinity_block_chars,
            block_tokens=c.affinity_block_tokens,
            affinity=c.affinity,
        )

    def _serves(self, backend: Backend, model: str) -> bool:
        if backend.target.models:
            return model in backend.target.models
        return self.book.serves(backend.index, model) is not False

    def candidates(self, model: str | None, exclude: set[int]) -> list[Backend]:
        """Backends for `model`: serving it at its current revision and not ejected; else serving it and not
        ejected (their answers are not stored, see `book`); else the one whose ejection ends first."""
        pool = self.backends
        if model is not None:  # a model no backend lists goes anywhere: the backend answers 404
            pool = [b for b in pool if self._serves(b, model)] or pool
        pool = [b for b in pool if b.index not in exclude]
        up = [b for b in pool if b.breaker.available()]
        current = self.book.current(model) if model is not None else None
        if current and model is not None:
            at_current = [b for b in up if (self.book.reports[b.index] or {}).get(model, current) == current]
            up = at_current or up
        return up or sorted(pool, key=lambda b: b.breaker.open_until)[:1]

    def pick(self, facts: Facts, exclude: set[int]) -> Backend | None:
        candidates = self.candidates(facts.model, exclude)
        if not candidates:
            return None
        match = self.affinity.match(facts.chain, [b.index for b in candidates]) if facts.chain else NO_MATCH
        chosen, how = choose(
            [Candidate(b.index, b.outstanding, b.target.weight, self._credit[b.index]) for b in candidates],
            match.backend,
            self.config.affinity_load_factor,
            extends=match.extends,
        )
        # Smooth weighted round-robin: every candidate earns its weight, the chosen one pays the total.
        for b in candidates:
            self._credit[b.index] += b.target.weight
        self._credit[chosen.index] -= sum(b.target.weight for b in candidates)
        if facts.chain:
            self.affinity.record(facts.chain, chosen.index)
            self._metrics.affinity.labels(how.value).inc()
        return self.backends[chosen.index]

    def _second(self, facts: Facts, tried: set[int]) -> Backend | None:
        """The backend for the one retry, or None (retries off, already retried, or nowhere else to go)."""
        if not self.config.retry_other_backend or len(tried) != 1:
            return None
        return self.pick(facts, tried)

    def _settle(self, backend: Backend, status: int, headers: Mapping[str, str], model: str | None) -> None:
        if status >= 500:
            backend.failed(f"HTTP {status}", retried=False)
        else:
            backend.succeeded()
        revision = headers.get(REVISION_HEADER)
        if revision and model is not None:
            self.book.saw(backend.index, model, revision)

    def _after_error(self, current: Backend, exc: UpstreamError, facts: Facts, tried: set[int]) -> Backend:
        """The backend for the retry after `exc`; re-raises `exc` when it is not retried."""
        again = self._second(facts, tried) if retriable(exc) else None
        current.failed(exc.message, retried=again is not None)
        if again is None:
            raise exc
        return again

    def _after_head(
        self, current: Backend, status: int, headers: Mapping[str, str], facts: Facts, tried: set[int]
    ) -> Backend | None:
        """None: this answer stands (settled on `current`); else the backend for the retry of a 502/503/504."""
        again = self._second(facts, tried) if status in RETRY_STATUSES else None
        if again is None:
            self._settle(current, status, headers, facts.model)
        else:
            current.failed(f"HTTP {status}", retried=True)
        return again

    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> UpstreamResponse:
        if method == "GET" and path_qs == MODELS_PATH:
            return await self.models(headers)
        facts = self.facts(method, path_qs, body)
        backend, tried = self.pick(facts, set()), set[int]()
        while backend is not None:
            current = backend  # `backend` moves on to the retry's; `current` is the one this attempt holds
            tried.add(current.index)
            current.begin()
            try:
                resp = await current.upstream.request(method, path_qs, headers, body)
            except UpstreamError as exc:
                backend = self._after_error(current, exc, facts, tried)
                continue
            finally:
                current.end()
            backend = self._after_head(current, resp.status, resp.headers, facts, tried)
            if backend is None:
                return resp
        raise UpstreamUnavailable("upstream unavailable: no backend")

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[Any]:
        facts = self.facts(method, path_qs, body)
        backend, tried = self.pick(facts, set()), set[int]()
        while backend is not None:
            current = backend  # `backend` moves on to the retry's; `current` is the one this attempt holds
            tried.add(current.index)
            current.begin()
            try:
                async with AsyncExitStack() as stack:
                    try:
                        resp = await stack.enter_async_context(
                            current.upstream.open_stream(method, path_qs, headers, body)
                        )
                    except UpstreamError as exc:
                        backend = self._after_error(current, exc, facts, tried)
                        continue
                    backend = self._after_head(current, resp.status, resp.headers, facts, tried)
                    if backend is not None:
                        continue
                    yield resp  # from here on bytes may reach the client: never retried
                    return
            finally:
                current.end()
        raise UpstreamUnavailable("upstream unavailable: no backend")

    async def _models_of(self, backend: Backend, headers: Mapping[str, str]) -> UpstreamResponse | None:
        try:
            resp = await backend.upstream.request("GET", MODELS_PATH, headers)
        except UpstreamError as exc:
            backend.failed(exc.message, retried=False)
            return None
        if resp.status == 200:
            if backend.target.models:  # configured to serve only these: list only these
                resp = dataclasses.replace(resp, body=only(resp.body, backend.target.models))
            self.book.report(backend.index, served_models(resp.body))
        return resp

    async def models(self, headers: Mapping[str, str]) -> UpstreamResponse:
        """`GET /v1/models` from every backend that takes traffic, merged (each model once, current revision)."""
        asked = [b for b in self.backends if b.breaker.available()] or self.backends
        answers = await asyncio.gather(*(self._models_of(b, headers) for b in asked))
        ok = [r for r in answers if r is not None and r.status == 200]
        if not ok:
            other = [r for r in answers if r is not None]
            if other:
                return other[0]
            raise UpstreamUnavailable("upstream unavailable: no backend answered /v1/models")
        body = merge([r.body for r in ok], self.book)
        return UpstreamResponse(
            200, CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"})), body
        )
