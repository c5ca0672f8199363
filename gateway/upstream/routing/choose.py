"""The routing decision for one miss, as a pure function of the candidates' loads and the affinity match.

Least outstanding requests per weight, unless prefix affinity names a candidate: then that one, unless its load
is above the guard (`guard`: `factor` x the candidates' mean load, at least the mean + 1; loads per weight), so a
hot prefix spills onto the least loaded backend instead of piling onto one (the SGLang router's load-guarded
cache-aware policy). Placement is sticky (a conversation's later turns follow its prefix), so the guard bounds the
long-run share too: at most about `factor` x the mean while the fleet is busy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Choice(Enum):
    AFFINITY = "hit"  # the backend holding the longest matching prefix
    GUARDED = "guarded"  # a prefix matched, but its backend was over the load guard
    LEAST_LOADED = "miss"  # no prefix matched (or affinity is off)


@dataclass(frozen=True, slots=True)
class Candidate:
    index: int
    load: float  # outstanding requests
    weight: float
    credit: float = 0.0  # smooth weighted round-robin credit (`UpstreamPool.pick`): ties go to the most


def _load(c: Candidate) -> float:
    return c.load / c.weight


def least_loaded(candidates: Sequence[Candidate]) -> Candidate:
    """The lowest load per weight; ties go to the most credit (smooth weighted round-robin, as nginx's upstream
    module does), so idle backends share sequential work in proportion to their weights."""
    return min(candidates, key=lambda c: (_load(c), -c.credit))


def guard(mean: float, factor: float) -> float:
    """The most load the affine backend may have: `factor` x the mean, but never less than the mean + 1 (at low
    loads a ratio alone would refuse a backend one request busier than an idle one)."""
    return max(factor * mean, mean + 1)


def choose(
    candidates: Sequence[Candidate], affine: int | None, factor: float, *, extends: bool = True
) -> tuple[Candidate, Choice]:
    """Pick one of `candidates` (non-empty); `affine` is the index the affinity table matched, if any. A match that
    only shares a prefix with other prompts (`extends` False) is held to the tighter guard of factor 1 (the mean
    + 1): new conversations spread evenly, and since they stay where they start, so does the long-run load."""
    assert candidates, "choose needs at least one candidate"
    if affine is not None:
        for c in candidates:
            if c.index == affine:
                mean = sum(_load(x) for x in candidates) / len(candidates)
                if _load(c) <= guard(mean, factor if extends else 1.0):
                    return c, Choice.AFFINITY
                return least_loaded(candidates), Choice.GUARDED
    return least_loaded(candidates), Choice.LEAST_LOADED
