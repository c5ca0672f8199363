"""The dashboard's per-worker state, a typed field of the app state: the history rings and the hot-keys table."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.dashboard.history import History
from gateway.dashboard.hotkeys import HotKeys


@dataclass(slots=True)
class DashboardState:
    history: History = field(default_factory=History)
    hot_keys: HotKeys = field(default_factory=HotKeys)
