"""What a served answer from an entry counts, on every lane: one call per answer.

`served`: the tokens, bytes and price saved (fresh hits and stale answers alike). `hit`: a fresh hit also counts in
the dashboard's hot-keys table and in the shared hot-key record that warms new replicas (a dict increment: no I/O
on the hit path). The tier lookups themselves are counted by the tiers (`TieredCache`).
"""

from __future__ import annotations

from gateway.hits.needs import HitState
from gateway.keys.entry import Entry


def served(state: HitState, entry: Entry) -> None:
    state.metrics.served_from_cache(entry.usage, len(entry.body), entry.model)


def hit(state: HitState, entry: Entry, now: float, prompt: str | None) -> None:
    """A fresh hit on `entry` served (`prompt`: the hot-keys table's text, None unless the operator opted in)."""
    served(state, entry)
    state.dashboard.hot_keys.hit(entry, now, prompt)
    record = state.hot_record
    if record is not None:
        record.hit(entry.key)
