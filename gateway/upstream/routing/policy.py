"""The policy selector (`upstream.routing_policy`), so policies can be compared on the same fleet (A/B).

- `cost` (default): the least expected time to first token (`cost`);
- `affinity`: the load-guarded prefix affinity (`choose`), the policy before `cost`;
- `least_loaded`: least outstanding requests per weight, ties by smooth weighted round-robin;
- `round_robin`: candidates in turn, blind to load and prefixes;
- `random`: a uniform draw (the injected `rng`).
Every decision carries its reason and the matched prefix, for the route header and the decisions metric. Pure: the
round-robin turn and the random draw come from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import assert_never

from gateway.upstream.routing.affinity import Match
from gateway.upstream.routing.choose import Candidate, choose, least_loaded
from gateway.upstream.routing.cost import EngineView, cheapest


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
    matched_tokens: int = 0  # of the prompt, on the chosen engine
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
) -> Decision:
    """Choose one of `engines` (non-empty). `legacy` is the affinity table's longest match (the `affinity`
    policy's input); `turn` counts this pool's decisions (round-robin)."""
    assert engines, "decide needs at least one engine"
    match policy:
        case Policy.COST:
            best, why = cheapest(engines, prompt_tokens)
            return Decision(
                best.engine.index, why.value, best.engine.matched_tokens, best.ttft_s, best.wait_s
            )
        case Policy.AFFINITY:
            chosen, how = choose(_candidates(engines), legacy.backend, load_factor, extends=legacy.extends)
            return Decision(chosen.index, how.value, _matched(engines, chosen.index))
        case Policy.LEAST_LOADED:
            chosen = least_loaded(_candidates(engines))
            return Decision(chosen.index, "least_loaded", _matched(engines, chosen.index))
        case Policy.ROUND_ROBIN:
            e = engines[turn % len(engines)]
            return Decision(e.index, "round_robin", e.matched_tokens)
        case Policy.RANDOM:
            e = engines[min(int(rng() * len(engines)), len(engines) - 1)]
            return Decision(e.index, "random", e.matched_tokens)
        case _:
            assert_never(policy)


def _candidates(engines: Sequence[EngineView]) -> list[Candidate]:
    return [Candidate(e.index, e.load, e.weight, e.credit) for e in engines]


def _matched(engines: Sequence[EngineView], index: int) -> int:
    return next(e.matched_tokens for e in engines if e.index == index)
