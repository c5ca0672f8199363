"""The cost policy: send a miss where its first token is expected soonest.

expected TTFT = queue wait + the prompt tokens that engine would still have to prefill (its matched prefix
subtracted) / its prefill rate. The queue wait and the rate come from the engine's pace (`pace`: its queue played
forward with each request's expected service time, this process's requests and the busy slots the engine itself
reports, so other replicas and direct clients count; the rate from the engine's own counters or its observed first
bytes). Prefix affinity is one term of that sum: a busy engine that holds the prefix wins when waiting for it is
expected to cost less than prefilling the prompt elsewhere (on one-slot engines, a short cached request ahead is
worth waiting for; a long queue is not), and an idle engine wins otherwise. The matched prefix counts at the share
the engine was seen to keep (`retention`: 1.0 for an engine that keeps its prefixes, lower for one that keeps only
its last prompt, whose reuse the router's record overstates; learnt from its answers). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Reason(Enum):
    PREFIX = "prefix"  # the chosen engine is expected to reuse the longest prefix of any candidate
    SPILL = "spill"  # another is expected to reuse more, but its queue would cost more than the prefill
    BALANCE = "balance"  # no candidate is expected to reuse any of the prompt: the least expected wait


@dataclass(frozen=True, slots=True)
class EngineView:
    """One candidate as the policies see it."""

    index: int
    load: float  # requests it is running or queueing (ours plus what it reports beyond them)
    slots: int  # requests it runs at once
    wait_s: float  # expected seconds before a request sent now starts (`pace.Pace.wait_s`)
    prefill_tokens_per_s: float
    matched_tokens: int  # prompt tokens it already holds (the router's record of what it was sent)
    weight: float = 1.0
    credit: float = 0.0  # smooth weighted round-robin credit: ties go to the most
    may_queue: bool = True  # may be chosen to queue while another engine is idle (`pool`: budget and share)
    retention: float = 1.0  # the share of its matched prefix it is expected to still hold (`retention`)

    @property
    def expected_tokens(self) -> float:
        """The prompt tokens it is expected to reuse: its matched prefix at the share it keeps."""
        return self.matched_tokens * self.retention


@dataclass(frozen=True, slots=True)
class Estimate:
    engine: EngineView
    wait_s: float
    prefill_s: float

    @property
    def ttft_s(self) -> float:
        return self.wait_s + self.prefill_s


def estimate(e: EngineView, prompt_tokens: int) -> Estimate:
    """The expected time to first token on `e` for a prompt of `prompt_tokens` (a weight above 1 shortens its
    queue: a bigger engine's share)."""
    prefill_s = max(prompt_tokens - e.expected_tokens, 0) / e.prefill_tokens_per_s
    return Estimate(e, e.wait_s / e.weight, prefill_s)


def cheapest(engines: Sequence[EngineView], prompt_tokens: int) -> tuple[Estimate, Reason]:
    """The engine with the least expected TTFT; ties go to the lower load per weight, then the most credit. While an
    engine is idle, one without a free slot is considered only if it `may_queue`."""
    assert engines, "cheapest needs at least one engine"
    pool = list(engines)
    if any(e.load == 0 for e in engines):
        pool = [e for e in engines if e.load < e.slots or e.may_queue]
    estimates = [estimate(e, prompt_tokens) for e in pool]
    best = min(
        estimates, key=lambda x: (round(x.ttft_s, 6), x.engine.load / x.engine.weight, -x.engine.credit)
    )
    deepest = max(e.expected_tokens for e in engines)
    if deepest == 0:
        return best, Reason.BALANCE
    return best, Reason.PREFIX if best.engine.expected_tokens == deepest else Reason.SPILL
