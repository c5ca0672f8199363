"""Hot-path metric tallies: plain dict arithmetic per request, folded into the Prometheus objects on flush.

A cache hit is a few dozen microseconds of work; prometheus_client spends several of them per observation (a
lock per value, a bucket scan per histogram sample, a label lookup per child). The tally keeps per-label counts
and per-bucket histogram counts in dicts and hands them to prometheus_client in bulk: before every scrape this
process answers and once a second from a background task (so other workers' scrapes, which read the shared
multiprocess files, lag by at most that second). Nothing is lost: a flush moves everything tallied so far.
A histogram sample is one list append; its bucket is found at flush time (at most a second of samples waits).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Occurrences
from collections.abc import Sequence
from functools import partial

from prometheus_client import Counter, Histogram

Labels = tuple[str, ...]
FOLD_EVERY = 512  # samples of one histogram child bucketed at once (about 0.1 ms of work)


class Tally:
    def __init__(self) -> None:
        self._counts: dict[tuple[Counter, Labels], float] = {}
        self._hists: dict[tuple[Histogram, Labels], list[float]] = {}  # per-bucket counts, then the sum
        self._bounds: dict[Histogram, Sequence[float]] = {}
        self._samples: dict[tuple[Histogram, Labels], list[float]] = {}  # observed, not yet bucketed

    def inc(self, counter: Counter, labels: Labels = (), amount: float = 1.0) -> None:
        key = (counter, labels)
        self._counts[key] = self._counts.get(key, 0.0) + amount

    def observe(self, histogram: Histogram, labels: Labels, value: float) -> None:
        """A dict lookup and a list append; the buckets are counted at `flush`, or once FOLD_EVERY samples wait (so
        a busy second is folded in small steps, never in one pause that would stall every request behind it)."""
        key = (histogram, labels)
        values = self._samples.get(key)
        if values is None:
            values = self._samples[key] = []
        values.append(value)
        if len(values) >= FOLD_EVERY:
            del self._samples[key]
            self._fold(key, values)

    def _fold_samples(self) -> None:
        samples, self._samples = self._samples, {}
        for key, values in samples.items():
            self._fold(key, values)

    def _fold(self, key: tuple[Histogram, Labels], values: list[float]) -> None:
        histogram = key[0]
        bounds = self._bounds.get(histogram)
        if bounds is None:
            bounds = self._bounds[histogram] = histogram._upper_bounds  # incl. +Inf (prometheus_client)
        slots = self._hists.get(key)
        if slots is None:
            slots = self._hists[key] = [0.0] * (len(bounds) + 1)
        # A sample lands in the first bucket whose upper bound is >= it (Prometheus `le` semantics); the
        # search and the counting run in C (map, Counter), not once per sample in Python.
        for bucket, n in Occurrences(map(partial(bisect_left, bounds), values)).items():
            slots[bucket] += n
        slots[-1] += sum(values)

    def flush(self) -> None:
        self._fold_samples()
        counts, self._counts = self._counts, {}
        hists, self._hists = self._hists, {}
        for (counter, labels), amount in counts.items():
            (counter.labels(*labels) if labels else counter).inc(amount)
        for (histogram, labels), slots in hists.items():
            child = histogram.labels(*labels) if labels else histogram
            # prometheus_client keeps one (non-cumulative) value per bucket plus the sum; add ours to them.
            for bucket, n in zip(child._buckets, slots[:-1], strict=True):
                if n:
                    bucket.inc(n)
            child._sum.inc(slots[-1])
