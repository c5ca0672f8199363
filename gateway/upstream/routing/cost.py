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

Piling up beside an idle engine (a second request on an engine, queued or batched, while another engine has none)
is charged in the choice (not in the estimate it reports): a queue once as this request's wait, and a queue or a
batch at the price of the pile-up it adds (`piles_s`), which the fleet keeps under a budget
(`pace.PileUp`): `pile_up_price`, from 0 while the fleet has not queued beside an idle engine lately up to
PILE_UP_WEIGHT at the budget (the caller's: the share spent over the budget). So near the budget a request waits
for the engine holding its prefix when the wait is short against the prefill it saves, and not when the two are
close: on two one-slot llama-servers (AVX2 EPYC, 2 vCPUs) a 4.8 s wait chosen to save 5.3 s of prefill spent the
whole budget at once, and the short waits after it then had to spill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

PILE_UP_WEIGHT = 1.0  # at the budget, a wait beside an idle engine is charged (1 + this) x its length


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
    # with `may_queue` False for the pile-up budget (not the share guard): a wait of at most this share of the
    # prefill it saves is still taken (`cheapest`)
    cheap_wait_share: float = 0.0
    # running requests with a free slot: seconds until the last of them is expected to end (`pace.Pace.drain_s`), so
    # how long one more would batch beside them while another engine sits idle
    batch_s: float = 0.0
    batches_pile: bool = False  # a batch of two beside an idle engine is pile-up (`upstream.pile_up_batches`)

    @property
    def piling(self) -> bool:
        """Whether one more request here piles up beside an idle engine: it queues, or joins a counted batch."""
        return self.load >= self.slots or (self.load > 0 and self.batches_pile)

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


def piles_s(x: Estimate) -> float:
    """How long sending `x`'s request piles it up on `x`'s engine (two or more requests there) beside an idle one:
    its wait where it queues, else while the engine's current requests run beside it (none on an idle engine)."""
    e = x.engine
    return x.wait_s if e.load >= e.slots else (e.batch_s / e.weight if e.piling else 0.0)


def estimate(e: EngineView, prompt_tokens: int) -> Estimate:
    """The expected time to first token on `e` for a prompt of `prompt_tokens` (a weight above 1 shortens its
    queue: a bigger engine's share)."""
    prefill_s = max(prompt_tokens - e.expected_tokens, 0) / e.prefill_tokens_per_s
    return Estimate(e, e.wait_s / e.weight, prefill_s)


def pile_up_price(share: float, budget: float) -> float:
    """The charge per second queued beside an idle engine, on top of the wait itself: the budget's spent share of
    PILE_UP_WEIGHT (none while the fleet has not piled up lately, all of it at the budget and past it)."""
    spent = share / budget if budget > 0 else 1.0
    return PILE_UP_WEIGHT * min(spent, 1.0)


def cheapest(
    engines: Sequence[EngineView], prompt_tokens: int, pile_up_price: float = PILE_UP_WEIGHT
) -> tuple[Estimate, Reason]:
    """The engine with the least expected TTFT, piling up beside an idle engine charged once more at
    `pile_up_price` per second it piles (`piles_s`: a queue's wait, or a batch's overlap with the requests it joins);
    ties go to the lower load per weight, then the most credit. While an engine is idle, one where the request
    would pile up (`EngineView.piling`) is considered only if it is expected to reuse more of the prompt than every
    engine where it would not (a prefix is the one reason to pile up: two engines' learnt prefill rates differ by
    their noise, 20% on one box, and on that alone a new prompt queued 0.2 s beside an idle engine) and it
    `may_queue`, or the pile-up is a cheap one: at most `cheap_wait_share` of the prefill it saves against
    the best of those engines (a spent budget then spills a wait of 0.2 s beside a 7 s prefill no more, while the
    waits that are long against what they save still spill). A batch of two counts as a queue does where
    `batches_pile` (on two of our backends the requests of one prompt group held both of the bench's requests on one
    engine for 22% of the busy time while the other sat idle); where not, an engine with a free slot is free."""
    assert engines, "cheapest needs at least one engine"
    pool = list(engines)
    idle = any(e.load == 0 for e in engines)
    if idle:
        free = [e for e in engines if not e.piling]
        free_s = min(estimate(e, prompt_tokens).ttft_s for e in free)
        free_tokens = max(e.expected_tokens for e in free)

        def may_pile(e: EngineView) -> bool:
            if e.expected_tokens <= free_tokens:
                return False
            x = estimate(e, prompt_tokens)
            return e.may_queue or piles_s(x) <= e.cheap_wait_share * (free_s - x.prefill_s)

        pool = [e for e in engines if not e.piling or may_pile(e)]

    def charged(x: Estimate) -> float:
        return x.ttft_s + (pile_up_price * piles_s(x) if idle else 0.0)

    estimates = [estimate(e, prompt_tokens) for e in pool]
    best = min(
        estimates, key=lambda x: (round(charged(x), 6), x.engine.load / x.engine.weight, -x.engine.credit)
    )
    deepest = max(e.expected_tokens for e in engines)
    if deepest == 0:
        return best, Reason.BALANCE
    return best, Reason.PREFIX if best.engine.expected_tokens == deepest else Reason.SPILL
