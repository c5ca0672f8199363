"""The routing decision for one miss, as a pure function of the candidates' loads and the affinity match.

Least outstanding requests per weight, unless prefix affinity names a candidate: then that one, unless its load
is above the guard (`factor` x the candidates' mean load + 1, loads per weight), so a hot prefix spills onto the
least loaded backend instead of piling onto one (the SGLang router's load-guarded cache-aware policy).
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
    outstanding: int
    weight: float


def _load(c: Candidate) -> float:
    return c.outstanding / c.weight


def least_loaded(candidates: Sequence[Candidate], turn: int) -> Candidate:
    """The lowest load per weight; ties go round-robin by `turn`, so idle backends share the work."""
    best = min(_load(c) for c in candidates)
    tied = [c for c in candidates if _load(c) == best]
    return tied[turn % len(tied)]


def choose(
    candidates: Sequence[Candidate], affine: int | None, factor: float, turn: int
) -> tuple[Candidate, Choice]:
    """Pick one of `candidates` (non-empty); `affine` is the index the affinity table matched, if any."""
    assert candidates, "choose needs at least one candidate"
    if affine is not None:
        for c in candidates:
            if c.index == affine:
                mean = sum(_load(x) for x in candidates) / len(candidates)
                if _load(c) <= factor * mean + 1:
                    return c, Choice.AFFINITY
                return least_loaded(candidates, turn), Choice.GUARDED
    return least_loaded(candidates, turn), Choice.LEAST_LOADED
