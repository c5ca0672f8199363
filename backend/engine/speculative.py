"""Exact speculative decoding by prompt lookup: drafts come from the sequence's own tokens, no second model.

Drafting: find the most recent earlier occurrence of the sequence's last n tokens (n from `max_ngram` down
to `min_ngram`) and propose the up to k tokens that followed it. Copy-heavy requests (quote, rewrite or fix
a given passage) repeat long runs of their prompt, so many drafts are right.

Verification: the last token and the k drafts run as one (k + 1)-token chunk; the greedy pick after each
position is compared with the next draft. Drafts are accepted up to the first mismatch, and the pick at that
point (or after the last draft) is appended too, so each verify forward yields 1 to k + 1 tokens. Under greedy
decoding the output is exactly the non-speculative output provided the chunk's logits equal those of
k + 1 single steps: the batch-invariant kernels (design §8) guarantee that, and tests check it.
Only greedy requests speculate; sampled ones never do.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    num_tokens: int = 4  # k: drafts per verify; 0 turns speculation off
    max_ngram: int = 3
    min_ngram: int = 2

    def __post_init__(self) -> None:
        if self.num_tokens < 0:
            raise ValueError(f"speculative num_tokens must be >= 0, got {self.num_tokens}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")


@dataclass(slots=True)
class RowCost:
    """What one more row costs a decode step, as a share of a one-row step, measured on the engine's own steps.

    A verify of k drafts is a (k + 1)-row step: it costs 1 + k * r one-row steps and yields 1 + accepted tokens, so
    drafts pay exactly when the share accepted exceeds r. Where extra rows ride on the weights' memory traffic (the
    AVX512 build: r about 0.1-0.3) nearly any acceptance pays; where the kernel is compute-bound (the AVX2 build,
    one thread: r about 0.5) a draft must be right about half the time. Timing decides only whether to draft, never
    a token: a verify's tokens are exactly the single steps' (batch-invariant kernels), so the output is the same.
    Until both a one-row and a wider decode step were timed, `break_even` is the caller's floor."""

    one_row_s: float | None = None
    marginal: float | None = None  # r, an exponential average over the wider decode steps
    weight: float = 0.2

    def record(self, rows: int, seconds: float) -> None:
        if rows == 1:
            last = self.one_row_s
            self.one_row_s = seconds if last is None else last + self.weight * (seconds - last)
        elif rows > 1 and self.one_row_s:
            share = max(0.0, (seconds - self.one_row_s) / ((rows - 1) * self.one_row_s))
            last = self.marginal
            self.marginal = share if last is None else last + self.weight * (share - last)

    def break_even(self, floor: float) -> float:
        """The share of drafted tokens that must be accepted for drafting to pay (at least `floor`)."""
        return floor if self.marginal is None else max(floor, self.marginal)


@dataclass(slots=True)
class ProbeYield:
    """How often drafting pays for this engine's requests, so that traffic whose answers do not repeat their prompts
    stops paying a probe per request. `rate`: an exponential average over finished requests that drafted of "its
    drafts paid" (accepted at least break-even). A new request probes while that rate is unknown or at least
    1 / `explore` (probing costs one request a few wider steps; a request whose drafts pay saves many); below it,
    only every `explore`th request probes, which keeps the rate up to date if copy-heavy requests come back. Speed
    only: a verify's tokens are exactly the single steps', drafted or not."""

    rate: float | None = None
    weight: float = 0.2
    explore: int = 8
    seen: int = 0  # requests asked about

    def record(self, drafted: int, accepted: int, break_even: float) -> None:
        """One finished request's drafting (nothing if it drafted nothing)."""
        if drafted > 0:
            paid = 1.0 if accepted >= break_even * drafted else 0.0
            self.rate = paid if self.rate is None else self.rate + self.weight * (paid - self.rate)

    def probes(self) -> bool:
        """Whether a new request probes."""
        self.seen += 1
        return self.rate is None or self.rate >= 1 / self.explore or self.seen % self.explore == 0


def propose(token_ids: Seq[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k draft tokens: what followed the latest earlier match of the longest suffix n-gram."""
    size = len(token_ids)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        suffix = list(token_ids[size - n :])
        # scan right to left for the latest earlier occurrence (not the suffix itself)
        for start in range(size - n - 1, -1, -1):
            if token_ids[start] == suffix[0] and list(token_ids[start : start + n]) == suffix:
                follow = list(token_ids[start + n : start + n + k])
                if follow:
                    return follow
    return []


def accept(drafts: Seq[int], picks: Seq[int]) -> list[int]:
    """The tokens a verify forward yields. picks[i]: the greedy token after the last token and drafts[:i]
    (len(picks) == len(drafts) + 1). Accepted drafts, then the pick at the first mismatch (or the bonus)."""
    assert len(picks) == len(drafts) + 1
    out: list[int] = []
    for draft, pick in zip(drafts, picks, strict=False):
        out.append(pick)
        if pick != draft:
            return out
    out.append(picks[-1])
    return out
