"""The policy selector (`upstream.routing_policy`), so policies can be compared on the same fleet (A/B).

- `cost` (default): the least expected time to first token (`cost`);
- `affinity`: the load-guarded prefix affinity (`choose`), the policy before `cost`;
- `least_loaded`: least outstanding requests per weight, ties by smooth weighted round-robin;
- `round_robin`: candidates in turn, blind to load and prefixes;
- `random`: a uniform draw (the injected `rng`).
Every decision carries its reason, the matched prefix and the reuse expected of it (the matched prefix at the
engine's retention), for the route header, the decisions metric and the engine's pace. Pure: the
round-robin turn and the random draw come from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import assert_never

from gateway.upstream.routing.affinity import Match
from gateway.upstream.routing.choose import Candidate, choose, least_loaded
from gateway.upstream.routing.cost import PILE_UP_WEIGHT, EngineView, cheapest


class Policy(Enum):
    COST = "cost"
    AFFINITY = "affinity"
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"


@dataclass(frozen=True, slots=True)
class Decision:
    index: int
    reason: str  # cost: prefix/spill/balance; affinity: hit/guarded/miss; the others: their own name
    matched_tokens: int = 0  # of the prompt, on the chosen engine (what the router sent it)
    expected_tokens: int = 0  # of which it is expected to reuse (matched x its retention)
    ttft_s: float | None = None  # the cost policy's estimate
    wait_s: float = 0.0  # of which the queue wait


def decide(
    policy: Policy,
    engines: Sequence[EngineView],
    *,
    prompt_tokens: int,
    legacy: Match,
    load_factor: float,
    turn: int,
    rng: Callable[[], float],
    pile_up_price: float = PILE_UP_WEIGHT,
) -> Decision:
    """Choose one of `engines` (non-empty). `legacy` is the affinity table's longest match (the `affinity`
    policy's input); `turn` counts this pool's decisions (round-robin); `pile_up_price` is the cost policy's
    charge for a second of queueing beside an idle engine (`cost`)."""
    assert engines, "decide needs at least one engine"
    match policy:
        case Policy.COST:
            best, why = cheapest(engines, prompt_tokens, pile_up_price)
            return _decision(best.engine, why.value, best.ttft_s, best.wait_s)
        case Policy.AFFINITY:
            chosen, how = choose(_candidates(engines), legacy.backend, load_factor, extends=legacy.extends)
            return _decision(_view(engines, chosen.index), how.value)
        case Policy.LEAST_LOADED:
            chosen = least_loaded(_candidates(engines))
            return _decision(_view(engines, chosen.index), "least_loaded")
        case Policy.ROUND_ROBIN:
            return _decision(engines[turn % len(engines)], "round_robin")
        case Policy.RANDOM:
            return _decision(engines[min(int(rng() * len(engines)), len(engines) - 1)], "random")
        case _:
            assert_never(policy)


def _decision(e: EngineView, reason: str, ttft_s: float | None = None, wait_s: float = 0.0) -> Decision:
    return Decision(e.index, reason, e.matched_tokens, round(e.expected_tokens), ttft_s, wait_s)


def _candidates(engines: Sequence[EngineView]) -> list[Candidate]:
    return [Candidate(e.index, e.load, e.weight, e.credit) for e in engines]


def _view(engines: Sequence[EngineView], index: int) -> EngineView:
    return next(e for e in engines if e.index == index)
