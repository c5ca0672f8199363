"""The cost policy: send a miss where its first token is expected soonest.

expected TTFT = queue wait + the prompt tokens that engine would still have to prefill (its matched prefix
subtracted) / its prefill rate. The queue wait is the engine's load (the larger of this process's outstanding
requests and the busy slots the engine itself reports, so other replicas and direct clients count) times its
observed service time, over its slots. Prefix affinity is one term of that sum, never a reason to queue: while
any candidate has a free slot only those with one are considered (an engine never holds a queue while another
sits idle), and among them the matched prefix decides. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Reason(Enum):
    PREFIX = "prefix"  # the chosen engine holds the longest matched prefix of any candidate
    SPILL = "spill"  # another engine holds a longer prefix, but its queue would cost more than the prefill
    BALANCE = "balance"  # no candidate holds any of the prompt: the least expected wait


@dataclass(frozen=True, slots=True)
class EngineView:
    """One candidate as the policies see it."""

    index: int
    load: float  # requests it is running or queueing (max of ours and what it reports)
    slots: int  # requests it runs at once
    service_s: float  # observed seconds per request (moving average)
    prefill_tokens_per_s: float
    matched_tokens: int  # prompt tokens it already holds (the router's record of what it was sent)
    weight: float = 1.0
    credit: float = 0.0  # smooth weighted round-robin credit: ties go to the most


@dataclass(frozen=True, slots=True)
class Estimate:
    engine: EngineView
    wait_s: float
    prefill_s: float

    @property
    def ttft_s(self) -> float:
        return self.wait_s + self.prefill_s


def free(e: EngineView) -> bool:
    return e.load < e.slots


def estimate(e: EngineView, prompt_tokens: int) -> Estimate:
    """The expected time to first token on `e` for a prompt of `prompt_tokens`."""
    wait_s = e.load * e.service_s / max(e.slots, 1) / e.weight
    prefill_s = max(prompt_tokens - e.matched_tokens, 0) / e.prefill_tokens_per_s
    return Estimate(e, wait_s, prefill_s)


def cheapest(engines: Sequence[EngineView], prompt_tokens: int) -> tuple[Estimate, Reason]:
    """The engine with the least expected TTFT among those with a free slot (all of them when none has one);
    ties go to the lower load per weight, then the most credit."""
    assert engines, "cheapest needs at least one engine"
    pool = [e for e in engines if free(e)] or list(engines)
    estimates = [estimate(e, prompt_tokens) for e in pool]
    best = min(
        estimates, key=lambda x: (round(x.ttft_s, 6), x.engine.load / x.engine.weight, -x.engine.credit)
    )
    deepest = max(e.matched_tokens for e in engines)
    if deepest == 0:
        return best, Reason.BALANCE
    return best, Reason.PREFIX if best.engine.matched_tokens == deepest else Reason.SPILL
