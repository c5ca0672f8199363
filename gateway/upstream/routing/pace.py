"""How long one engine takes, as the cost policy expects it: when its queue will reach a new request, and how fast
it prefills. Learnt from this process's own requests to it; the prefill rate from the engine's own counters where it
reports them (llama-server's `/metrics`). Pure: the caller passes the clock's reading.

A request's expected service time is `fixed_s + unmatched prompt tokens x s_per_token`: `fixed_s` (the rest: the
hop, the first decode step, the answer's decode) is a moving average over requests sent while the engine was idle,
less their prefill at the rate known now (the averages of their times and of their unmatched tokens are kept, so a
rate learnt later corrects it at once: taken at the configured rate, two 5 s misses on a one-slot llama-server left
1 s of prefill in `fixed_s`, and cached requests were expected to wait 1.0-1.2 s where they waited 0.25-0.45);
`s_per_token` is, in order, the engine's own prompt rate (`reported`), a fit of the
first-byte times of streams sent to it idle against their unmatched tokens (`Fit`, once those spread enough to say
anything), or the configured `prefill_tokens_per_s`.

The wait of a new request plays the engine's queue forward, first come first served on `slots` slots: each request
in flight starts when it was sent or when a slot frees, and holds its slot for its expected service time; one past
its expected end is taken to need a quarter of that time again (it is running long, not done). Busy slots the
engine reports beyond this process's requests (other workers, replicas, direct clients) each hold a slot for half
the observed mean service time (how far along they are is unknown). On a one-slot engine (llama-server `-np 1`)
this is its real queue: a request behind a short cached one waits that long, not a mean service time, so the cost
policy can tell a momentarily busy engine that holds the prefix from one with a long queue.

The fleet's recent history bounds that waiting while another engine sits idle: `PileUp` (the share of busy time
spent so) and `Recent` (each engine's share of the requests sent).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

FIXED_SEED_S = 0.05  # the non-prefill part of a request before any was observed
ALPHA = 0.2  # the weight of each new observation in the moving averages
OVERRUN_SHARE = 0.25  # a request past its expected end still holds its slot this share of its expected time
MIN_SPREAD_TOKENS = 32.0  # the fit's samples must spread at least this much (standard deviation) to be used
MIN_REPORT_TOKENS = 64.0  # the engine's counters say a rate once this many more tokens were computed
FIT_DECAY = 0.95  # the fit forgets old samples at this rate per sample
S_PER_TOKEN_BOUNDS = (1e-7, 1.0)  # seconds per prefilled token: anything outside is a bad sample
SHARE_FACTOR = (
    1.25  # above this x its fair share of recent requests, an engine is not waited for beside an idle one
)


@dataclass(slots=True)
class Fit:
    """A least-squares line y = a + b x over exponentially decayed samples."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        d = FIT_DECAY
        self.n, self.sx, self.sy = self.n * d + 1, self.sx * d + x, self.sy * d + y
        self.sxx, self.sxy = self.sxx * d + x * x, self.sxy * d + x * y

    def slope(self) -> float | None:
        """b, once the samples' x spread at least MIN_SPREAD_TOKENS and b is positive; else None."""
        if self.n < 3:
            return None
        var = self.sxx / self.n - (self.sx / self.n) ** 2
        if var < MIN_SPREAD_TOKENS**2:
            return None
        b = (self.sxy / self.n - self.sx * self.sy / self.n**2) / var
        return b if b > 0 else None


@dataclass(slots=True)
class Ticket:
    """One request in flight: when it was sent, its expected service time, its prefill, whether it found the
    engine idle (then its times teach `fixed_s` and the fit)."""

    sent: float
    expect_s: float
    unmatched: int
    idle: bool
    first_byte: float | None = None  # when a stream's first body chunk came
    ok: bool = False  # answered (below 500): only then do its times teach anything
    light: bool = False  # a tokenizer call (`facts.LIGHT_PATHS`): in no queue, teaches nothing


@dataclass(slots=True)
class Pace:
    s_per_token: float  # seconds per prefilled prompt token
    fixed_s: float = FIXED_SEED_S
    reported: bool = False  # s_per_token is the engine's own rate
    fit: Fit = field(default_factory=Fit)
    flying: list[Ticket] = field(default_factory=list)  # this process's requests in flight, in send order
    _counters: tuple[float, float] | None = None  # the engine's last (prompt tokens, prompt seconds) totals
    # moving averages of (seconds, unmatched tokens) of the requests sent idle (`fixed_s` is recounted from them)
    _idle: tuple[float, float] | None = None

    def expect_s(self, unmatched: int) -> float:
        return self.fixed_s + unmatched * self.s_per_token

    def begin(self, now: float, unmatched: int, *, idle: bool) -> Ticket:
        ticket = Ticket(now, self.expect_s(unmatched), unmatched, idle)
        self.flying.append(ticket)
        return ticket

    def end(self, ticket: Ticket, now: float) -> None:
        """`ticket`'s request ended; an answered one sent to the idle engine teaches its times."""
        if ticket in self.flying:
            self.flying.remove(ticket)
        if not ticket.ok or not ticket.idle:
            return
        took, (avg_s, avg_tokens) = now - ticket.sent, self._idle or (self.fixed_s, 0.0)
        self._idle = (avg_s + ALPHA * (took - avg_s), avg_tokens + ALPHA * (ticket.unmatched - avg_tokens))
        if ticket.first_byte is not None:
            self.fit.add(ticket.unmatched, ticket.first_byte - ticket.sent)
            slope = self.fit.slope()
            if slope is not None and not self.reported:
                self.s_per_token = _bounded(slope)
        self._refix()

    def _refix(self) -> None:
        """`fixed_s` at the rate known now: the idle requests' mean time less their mean prefill."""
        if self._idle is not None:
            avg_s, avg_tokens = self._idle
            self.fixed_s = max(avg_s - avg_tokens * self.s_per_token, 0.0)

    def engine_counters(self, tokens: float, seconds: float) -> None:
        """The engine's cumulative prompt tokens computed and seconds spent computing them: the rate over the
        tokens since the last report (when there are enough to say)."""
        last, self._counters = self._counters, (tokens, seconds)
        d_tokens, d_seconds = (tokens - last[0], seconds - last[1]) if last else (tokens, seconds)
        if d_tokens < MIN_REPORT_TOKENS or d_seconds <= 0:
            if last is not None and d_tokens < 0:  # the engine restarted: start again from its totals
                self._counters = None
            return
        sample = _bounded(d_seconds / d_tokens)
        self.s_per_token = (
            sample if not self.reported else self.s_per_token + ALPHA * (sample - self.s_per_token)
        )
        self.reported = True
        self._refix()

    def wait_s(self, now: float, slots: int, foreign: int, foreign_s: float) -> float:
        """Seconds until a request sent now would start (see the module doc)."""
        free = [float("-inf")] * max(slots, 1)  # when each slot frees, as a heap
        for t in self.flying:
            start = max(t.sent, heapq.heappop(free))
            heapq.heappush(free, max(start + t.expect_s, now + OVERRUN_SHARE * t.expect_s))
        for _ in range(foreign):
            heapq.heappush(free, max(now, heapq.heappop(free)) + foreign_s / 2)
        return max(0.0, free[0] - now)

    def drain_s(self, now: float, foreign: int, foreign_s: float) -> float:
        """Seconds until every request in flight is expected to have ended, each in a slot of its own from when it
        was sent (an engine that batches them): how long one more would run beside them."""
        ends = [max(t.sent + t.expect_s, now + OVERRUN_SHARE * t.expect_s) for t in self.flying]
        ends += [now + foreign_s / 2] * foreign
        return max([0.0, *(end - now for end in ends)])


def _bounded(s_per_token: float) -> float:
    low, high = S_PER_TOKEN_BOUNDS
    return min(max(s_per_token, low), high)


@dataclass(slots=True)
class PileUp:
    """The share of the fleet's recent busy time in which some engine held two or more requests (a queue on a
    one-slot engine, a batch on one that batches) while another sat idle, over a decaying horizon: the cost policy
    prices a wait beside an idle engine (waiting for the one holding the prefix) by this share's part of its budget
    (`upstream.queue_beside_idle_share`), and past the budget takes only cheap waits (`cost.cheapest`): any other
    miss takes the idle engine, pays a prefill, and its group then has a second home, so a fleet whose prefixes
    all sit on one engine spreads again."""

    horizon_s: float = 30.0
    busy_s: float = 0.0
    piled_s: float = 0.0
    since: float | None = None
    state: tuple[bool, bool] = (False, False)  # (busy, piled) since `since`

    def _decayed(self, now: float) -> tuple[float, float]:
        if self.since is None:
            return 0.0, 0.0
        keep = math.exp(-max(now - self.since, 0.0) / self.horizon_s)
        fresh = self.horizon_s * (1.0 - keep)  # the decayed length of the interval since `since`
        busy, piled = self.state
        return self.busy_s * keep + (fresh if busy else 0.0), self.piled_s * keep + (fresh if piled else 0.0)

    def observe(self, now: float, *, busy: bool, piled: bool) -> None:
        """The fleet's state changed at `now` (a request began or ended)."""
        self.busy_s, self.piled_s = self._decayed(now)
        self.since, self.state = now, (busy, piled)

    def share(self, now: float) -> float:
        busy, piled = self._decayed(now)
        return piled / busy if busy > 0 else 0.0


@dataclass(slots=True)
class Recent:
    """Each engine's share of the requests sent lately (counts decayed over `horizon_s`). An engine whose share is
    above SHARE_FACTOR (1.25) x its fair share (its weight over the candidates') is not waited for beside an idle one: a
    fleet whose prefixes all sit on one engine (the survivor of an outage, a hot prefix) spreads again, while one
    whose prefixes are spread keeps waiting for the engine that holds them. The window starts again at each
    ejection (`restart`): the shares before it describe a fleet whose ejected engine may come back empty, and
    kept, they hide a short outage (a survivor that took every request for 3 s of a 30 s window stays under the
    factor, and is waited for beside the idle restored engine).

    The guard holds from an ejection until every engine has taken requests again and none is over the factor; in
    a steady fleet it is off, where its judgement of a few requests' shares was noise: with 6 prefixes on 2
    engines, one engine's 7 of the first 11 requests spilled a request that had 0.13 s to wait beside a 5 s prefill
    (the pile-up budget and the cost policy's own queue model spread a hot engine there)."""

    counts: list[float]
    horizon_s: float = 30.0
    since: float | None = None
    armed: bool = False  # from an ejection until the shares are even again

    def sent(self, now: float, index: int) -> None:
        if self.since is not None:
            keep = math.exp(-max(now - self.since, 0.0) / self.horizon_s)
            self.counts = [c * keep for c in self.counts]
        self.since = now
        self.counts[index] += 1.0

    def restart(self) -> None:
        """Count from now on only, and guard: an engine was ejected."""
        self.counts = [0.0] * len(self.counts)
        self.armed = True

    def over(self, index: int, weights: dict[int, float]) -> bool:
        """While armed: is `index`'s share of the requests sent to `weights`' engines above SHARE_FACTOR x its
        weight's share? Disarms once every engine of the fleet is among `weights`, has taken a request since the
        ejection, and none is over."""
        total = sum(self.counts[i] for i in weights)
        if not self.armed or total <= 0:
            return False
        whole = sum(weights.values())
        over = {i: self.counts[i] / total > SHARE_FACTOR * w / whole for i, w in weights.items()}
        if (
            len(weights) == len(self.counts)
            and all(self.counts[i] > 0 for i in weights)
            and not any(over.values())
        ):
            self.armed = False
        return over[index]
