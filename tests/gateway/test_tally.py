"""The hot-path tally folds into exactly what direct prometheus_client calls would have recorded."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.ops.tally import FOLD_EVERY, Tally

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = [0.0005, 0.001, 0.0011, 0.05, 0.1, 0.5, 1.0, 3.0, 0.0]


def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    """Every sample except the `_created` timestamps, which differ between two registries by construction."""
    return [
        (s.name, s.labels, s.value)
        for m in registry.collect()
        for s in m.samples
        if not s.name.endswith("_created")
    ]


def metrics() -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["a"], registry=registry)
    histogram = Histogram("h", "h", ["a"], buckets=BUCKETS, registry=registry)
    return registry, counter, histogram


def test_tally_flush_equals_direct_recording() -> None:
    direct_registry, direct_counter, direct_hist = metrics()
    tally_registry, tally_counter, tally_hist = metrics()
    tally = Tally()
    for i, value in enumerate(VALUES):
        label = "x" if i % 2 else "y"
        direct_counter.labels(label).inc(i)
        direct_hist.labels(label).observe(value)
        tally.inc(tally_counter, (label,), i)
        tally.observe(tally_hist, (label,), value)
    assert samples(tally_registry) != samples(direct_registry)  # nothing recorded before the flush
    tally.flush()
    assert samples(tally_registry) == samples(direct_registry)


def test_flush_moves_everything_once() -> None:
    registry, counter, histogram = metrics()
    tally = Tally()
    tally.inc(counter, ("z",), 2)
    tally.observe(histogram, ("z",), 0.2)
    tally.flush()
    tally.flush()
    assert registry.get_sample_value("c_total", {"a": "z"}) == 2
    assert registry.get_sample_value("h_count", {"a": "z"}) == 1
    assert registry.get_sample_value("h_bucket", {"a": "z", "le": "1.0"}) == 1
    assert registry.get_sample_value("h_bucket", {"a": "z", "le": "0.1"}) == 0


def test_a_busy_child_is_bucketed_in_small_steps_and_still_exactly() -> None:
    """Past FOLD_EVERY waiting samples a child is bucketed at once (no one-second pile to fold in one pause);
    the flush still records exactly what direct recording does."""
    direct_registry, _, direct_hist = metrics()
    tally_registry, _, tally_hist = metrics()
    tally = Tally()
    values = [VALUES[i % len(VALUES)] for i in range(2 * FOLD_EVERY + 7)]
    for value in values:
        direct_hist.labels("x").observe(value)
        tally.observe(tally_hist, ("x",), value)
    assert len(tally._samples[(tally_hist, ("x",))]) == 7  # two steps bucketed already, 7 waiting
    assert samples(tally_registry) != samples(direct_registry)  # bucketed, but not recorded before the flush
    tally.flush()
    got, want = samples(tally_registry), samples(direct_registry)
    assert [s for s in got if s[0] != "h_sum"] == [s for s in want if s[0] != "h_sum"]  # every count exact
    assert [s[2] for s in got if s[0] == "h_sum"] == pytest.approx([s[2] for s in want if s[0] == "h_sum"])
