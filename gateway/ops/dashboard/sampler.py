"""The dashboard's per-worker state and the task that samples `/metrics` into its history.

One snapshot at startup (the baseline every window starts from), then one per 10 s step (the finest window's), read
from the same collectors `/metrics` renders (only the charted families, without the text round trip: a few ms).
`/dashboard/data` also records when a step is due, so the series never lag the counters by more than the live
interval. In multiprocess mode the task also saves this worker's hot-keys table for the others once a second, when
it changed (gateway.ops.dashboard.hotkeys).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from gateway.ops.dashboard.dashboard_state import DashboardState
from gateway.ops.dashboard.history import Snapshot, snapshot
from gateway.ops.metrics import GatewayMetrics


class SampledState(Protocol):
    """What the sampler reads of the gateway's state (the shell's `GatewayState` provides it)."""

    metrics: GatewayMetrics
    dashboard: DashboardState

    @property
    def clock(self) -> Callable[[], float]: ...


TICK_S = 1.0  # the loop's period: a snapshot when a step is due, the hot-keys file when it changed


def sample(state: SampledState) -> Snapshot:
    """Read the charted counters now (all workers'), record them where a step is due."""
    snap = snapshot(state.metrics.samples(charted_only=True))
    state.dashboard.history.record(state.clock(), snap)
    return snap


async def sampler(state: SampledState) -> AsyncIterator[None]:
    """cleanup_ctx (after the cache ctx): the baseline snapshot, then one per step, on this worker."""
    sample(state)
    shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

    async def loop() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if state.dashboard.history.due(state.clock()):
                sample(state)
            if shared_dir:
                state.dashboard.hot_keys.save(shared_dir)

    task = asyncio.create_task(loop(), name="tokenedge-dashboard-sampler")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
