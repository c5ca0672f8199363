"""The dashboard's per-worker state, a typed field of the app state: the history rings, the hot-keys table and the
last upstream probe."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.ops.dashboard.history import History
from gateway.ops.dashboard.hotkeys import HotKeys


@dataclass(slots=True)
class DashboardState:
    history: History = field(default_factory=History)
    hot_keys: HotKeys = field(default_factory=HotKeys)
    probe: tuple[float, dict[str, object]] | None = (
        None  # (monotonic time, upstream health) of the last probe
    )
