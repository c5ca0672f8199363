"""`UpstreamPool`: many HTTP backends behind the one `UpstreamTransport` seam (fills, tees, relays, the catalog).

Per request: read the model and prompt chain (`facts`), narrow the backends to those serving the model at its
current revision (`book`) and not ejected (`breaker`), pick one by the configured policy (`policy`; by default
`cost`: the least expected time to first token), and send. Admission: when every candidate is at its
`max_outstanding`, the miss waits up to `admission_wait_s` for one, then is refused (503, Retry-After).
Each attempt is bounded (`attempt`): a stream by its first-byte deadline, every attempt by its backend's ejection.
An answer's reported reuse (cached prompt tokens) against the prefix the router expected teaches the backend's
`retention`, read from a JSON body whole and from a stream as it passes (`retention.UsageTap`).
Retry rule: a failure before any byte can have reached the client (a connect error, the backend dying before its
response head, or, for `request`, before the whole body was read; or a 502/503/504 head) is retried once on
another backend. `open_stream` hands the head to the caller, which
relays the body as it arrives, so nothing after the head is ever retried. Every 5xx and transport failure counts
towards the backend's ejection; a successful answer closes a half-open circuit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.config.upstream import UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.catalog import REVISION_HEADER
from gateway.upstream.http import UpstreamResponse, translate
from gateway.upstream.routing.affinity import NO_MATCH, AffinityTable
from gateway.upstream.routing.attempt import Ejected, FirstByteTimeout, Routed, bounded, route_headers
from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.book import RevisionBook, merge, only, served_models
from gateway.upstream.routing.cost import EngineView, pile_up_price
from gateway.upstream.routing.facts import Facts, facts_of
from gateway.upstream.routing.pace import PileUp, Recent, Ticket
from gateway.upstream.routing.policy import Decision, Policy, decide
from gateway.upstream.routing.retention import reuse_of
from gateway.upstream.routing.share import SharedPlacement
from gateway.web.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable

RETRY_STATUSES = frozenset({502, 503, 504})  # the backend could not answer: nothing was generated
MODELS_PATH = "/v1/models"


Route = tuple[Backend, Decision]


class Saturated(UpstreamError):
    """Every backend stayed at its `max_outstanding` for `admission_wait_s`: ask again later."""

    status = 503
    code = "upstream_saturated"


def retriable(exc: UpstreamError) -> bool:
    """Worth another backend: it could not be reached, or it died before answering whole, or it was ejected or
    missed the first-byte deadline. Not a read timeout: that backend may still be generating, and a second one
    would double the wait."""
    if isinstance(exc, Ejected | FirstByteTimeout):
        return True
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
        self.metrics = metrics
        self._credit = [0.0] * len(backends)  # tie-breaks between equally loaded backends (smooth WRR)
        self.policy = Policy(config.routing_policy)
        self.rng = random.Random().random  # the `random` policy's draw (a test injects its own)
        self._turn = 0  # the `round_robin` policy's counter
        self._freed: asyncio.Event | None = None  # set when a request ends (admission waiters)
        self.pile_up = PileUp()  # how long engines queued beside idle ones lately (the cost policy's budget)
        self.recent = Recent([0.0] * len(backends))  # each engine's share of recent requests
        self.share: SharedPlacement | None = None  # placements shared with other processes (`share`)
        for b in backends:
            b.on_eject = self.ejected

    def ejected(self, backend: int) -> None:
        """`backend` may come back empty: forget what it was sent, here and in what other processes report, and
        start the share guard's window again (`pace.Recent`), so that it refills the engine when it is back."""
        self.affinity.forget(backend)
        self.recent.restart()
        if self.share is not None:
            self.share.ejected(backend)

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

    def _views(self, facts: Facts, candidates: list[Backend]) -> list[EngineView]:
        """What the policies see of each candidate: it may pile up beside an idle engine while the budget is unspent
        and its share of recent requests not far above fair (`pace`); past the budget, cheaply (`cost.cheapest`)."""
        indices, now, batches = [b.index for b in candidates], time.monotonic(), self.config.pile_up_batches
        depths = self.affinity.depths(facts.chain, indices) if facts.chain else dict.fromkeys(indices, 0)
        budget = self.pile_up.share(now) < self.config.queue_beside_idle_share
        weights = {b.index: b.target.weight for b in candidates}
        guarded = {b.index: self.recent.over(b.index, weights) for b in candidates}
        return [
            EngineView(
                b.index,
                b.load,
                b.slots,
                b.pace.wait_s(now, b.slots, b.foreign_busy, b.service_s),
                1.0 / b.pace.s_per_token,
                min(int(depths[b.index] * facts.block_tokens), facts.prompt_tokens),
                b.target.weight,
                self._credit[b.index],
                budget and not guarded[b.index],
                b.retention.value,
                0.0 if guarded[b.index] else self.config.queue_beside_idle_share,
                b.pace.drain_s(now, b.foreign_busy, b.service_s) if batches and 0 < b.load < b.slots else 0.0,
                batches,
            )
            for b in candidates
        ]

    def pick(self, facts: Facts, exclude: set[int], *, admit: bool = False) -> Route | Saturated | None:
        """The backend for an attempt and why; Saturated when `admit` and every candidate is at its cap."""
        candidates = self.candidates(facts.model, exclude)
        if facts.light and candidates:  # takes no slot: not admitted, not counted (`facts.LIGHT_PATHS`)
            chosen = min(candidates, key=lambda b: ((b.load + b.light) / b.target.weight, b.index))
            return chosen, Decision(chosen.index, "light")
        if admit and candidates:
            candidates = [b for b in candidates if not b.saturated]
            if not candidates:
                return Saturated("upstream saturated: every backend is at its limit", headers={})
        if not candidates:
            return None
        legacy = self.affinity.match(facts.chain, [b.index for b in candidates]) if facts.chain else NO_MATCH
        decision = decide(
            self.policy,
            self._views(facts, candidates),
            prompt_tokens=facts.prompt_tokens,
            legacy=legacy,
            load_factor=self.config.affinity_load_factor,
            turn=self._turn,
            rng=self.rng,
            pile_up_price=pile_up_price(
                self.pile_up.share(time.monotonic()), self.config.queue_beside_idle_share
            ),
        )
        self._turn += 1
        # Smooth weighted round-robin: every candidate earns its weight, the chosen one pays the total.
        for b in candidates:
            self._credit[b.index] += b.target.weight
        self._credit[decision.index] -= sum(b.target.weight for b in candidates)
        chosen = self.backends[decision.index]
        self.recent.sent(time.monotonic(), chosen.index)
        if facts.chain:
            self.affinity.record(facts.chain, chosen.index)
            if self.share is not None:
                self.share.publish(facts.chain, chosen.index)
            if self.policy is Policy.AFFINITY:
                self.metrics.affinity.labels(decision.reason).inc()
        self.metrics.decisions.labels(chosen.url, self.policy.value, decision.reason).inc()
        self.metrics.matched_tokens.labels(chosen.url).inc(decision.matched_tokens)
        return chosen, decision

    async def _first(self, facts: Facts) -> Route | None:
        """The first attempt's route, after waiting (bounded) for a backend below its cap."""
        if self.share is not None and facts.chain:
            await self.share.learn(facts.chain, self.affinity)  # bounded: placement_wait_s
        loop = asyncio.get_running_loop()
        until = loop.time() + self.config.admission_wait_s
        while True:
            route = self.pick(facts, set(), admit=True)
            if not isinstance(route, Saturated):
                return route
            left = until - loop.time()
            if left <= 0:
                self.metrics.rejected.inc()
                route.headers["Retry-After"] = str(max(1, math.ceil(self.config.admission_wait_s)))
                raise route
            if self._freed is None:
                self._freed = asyncio.Event()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), left)

    def _begin(self, route: Route, facts: Facts) -> Ticket:
        ticket = route[0].begin(facts.prompt_tokens - route[1].expected_tokens, light=facts.light)
        if not facts.light:
            self._observe()
        return ticket

    def _observe(self) -> None:
        """Pile-up after a request began or ended: an engine queues (`pile_up_batches`: holds 2) beside an idle one."""
        up, batches = [b for b in self.backends if b.breaker.available()], self.config.pile_up_batches
        self.pile_up.observe(
            time.monotonic(),
            busy=any(b.load > 0 for b in up),
            piled=any(b.load >= (2 if batches else b.slots + 1) for b in up) and any(b.load == 0 for b in up),
        )

    def _release(self, backend: Backend, ticket: Ticket) -> None:
        backend.end(ticket)
        if ticket.light:
            return
        self._observe()
        freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()

    def _second(self, facts: Facts, tried: set[int]) -> Route | None:
        """The route for the one retry, or None (retries off, already retried, or nowhere else to go)."""
        if not self.config.retry_other_backend or len(tried) != 1:
            return None
        route = self.pick(facts, tried)
        return None if isinstance(route, Saturated) else route

    def _settle(self, backend: Backend, status: int, headers: Mapping[str, str], model: str | None) -> None:
        if status >= 500:
            backend.failed(f"HTTP {status}", retried=False)
        else:
            backend.succeeded()
        revision = headers.get(REVISION_HEADER)
        if revision and model is not None:
            self.book.saw(backend.index, model, revision)

    def _after_error(self, current: Backend, exc: UpstreamError, facts: Facts, tried: set[int]) -> Route:
        """The route for the retry after `exc`; re-raises `exc` when it is not retried."""
        if isinstance(exc, FirstByteTimeout):
            self.metrics.first_byte_timeouts.labels(current.url).inc()
        again = self._second(facts, tried) if retriable(exc) else None
        current.failed(exc.message, retried=again is not None)
        if again is None:
            raise exc
        return again

    def _after_head(
        self, current: Backend, status: int, headers: Mapping[str, str], facts: Facts, tried: set[int]
    ) -> Route | None:
        """None: this answer stands (settled on `current`); else the route for the retry of a 502/503/504."""
        again = self._second(facts, tried) if status in RETRY_STATUSES else None
        if again is None:
            self._settle(current, status, headers, facts.model)
        else:
            current.failed(f"HTTP {status}", retried=True)
        return again

    def _headers(self, upstream: CIMultiDictProxy[str], route: Route) -> CIMultiDictProxy[str]:
        if not self.config.route_headers:
            return upstream
        return route_headers(upstream, route[0], route[1], self.policy)

    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> UpstreamResponse:
        if method == "GET" and path_qs == MODELS_PATH:
            return await self.models(headers)
        facts = self.facts(method, path_qs, body)
        route, tried = await self._first(facts), set[int]()
        while route is not None:
            current = route[0]  # `route` moves on to the retry's; `current` is the one this attempt holds
            tried.add(current.index)
            ticket = self._begin(route, facts)
            try:  # a whole answer: only the ejection bounds it (a long generation is not cut)
                resp = await bounded(current.upstream.request(method, path_qs, headers, body), current, 0)
                if resp.status < 500:
                    current.served(ticket)
            except UpstreamError as exc:
                route = self._after_error(current, exc, facts, tried)
                continue
            finally:
                self._release(current, ticket)
            again = self._after_head(current, resp.status, resp.headers, facts, tried)
            if again is None:
                if resp.status == 200 and route[1].matched_tokens > 0:  # else no evidence: not searched
                    current.reused(route[1].matched_tokens, facts.prompt_tokens, reuse_of(resp.body))
                return dataclasses.replace(resp, headers=self._headers(resp.headers, route))
            route = again
        raise UpstreamUnavailable("upstream unavailable: no backend")

    @staticmethod
    async def _prime(resp: Any, backend: Backend, deadline_s: float, started: float) -> bytes:
        """An event stream's first body chunk, within what is left of its first-byte deadline (an engine may send
        its head at once and its first token much later); nothing is read without a deadline."""
        if not deadline_s or not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return b""
        left_s = max(deadline_s - (time.monotonic() - started), 1e-3)
        return await bounded(resp.content.readany(), backend, left_s)

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[Any]:
        facts = self.facts(method, path_qs, body)
        deadline_s = self.config.first_byte_timeout_s if facts.stream else 0.0
        route, tried = await self._first(facts), set[int]()
        while route is not None:
            current = route[0]  # `route` moves on to the retry's; `current` is the one this attempt holds
            tried.add(current.index)
            ticket = self._begin(route, facts)
            started = time.monotonic()
            try:
                async with AsyncExitStack() as stack:
                    try:
                        resp = await bounded(
                            stack.enter_async_context(
                                current.upstream.open_stream(method, path_qs, headers, body)
                            ),
                            current,
                            deadline_s,
                        )
                        first = await self._prime(resp, current, deadline_s, started)
                        if first:
                            current.first_byte(ticket)
                    except UpstreamError as exc:
                        route = self._after_error(current, exc, facts, tried)
                        continue
                    except (TimeoutError, aiohttp.ClientError) as exc:
                        route = self._after_error(current, translate(exc), facts, tried)
                        continue
                    again = self._after_head(current, resp.status, resp.headers, facts, tried)
                    if again is not None:
                        route = again
                        continue
                    routed = Routed(resp, first, self._headers(resp.headers, route))
                    # From here on bytes may reach the client: never retried, but cut if its backend is ejected.
                    cut = current.ejection()
                    cut.add_done_callback(routed.close)
                    try:
                        yield routed
                    finally:
                        cut.remove_done_callback(routed.close)
                    current.served(ticket)
                    if routed.status == 200 and route[1].matched_tokens > 0:  # else no evidence: not parsed
                        current.reused(route[1].matched_tokens, facts.prompt_tokens, routed.tap.reuse())
                    return
            finally:
                self._release(current, ticket)
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
