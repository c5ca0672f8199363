"""What the hit core reads of the gateway's state: the shell's `GatewayState` provides it, and nothing here knows
the shell (a port, so that the hit core depends only on the layers below it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.config.settings import GatewayConfig
from gateway.hits.tenancy import Tenancy
from gateway.ops.dashboard.dashboard_state import DashboardState
from gateway.ops.metrics import GatewayMetrics
from gateway.tiers.hotrecord import HotRecord
from gateway.tiers.tiered import TieredCache


class HitState(Protocol):
    config: GatewayConfig
    metrics: GatewayMetrics

    @property
    def clock(self) -> Callable[[], float]: ...

    cache: TieredCache
    dashboard: DashboardState
    tenancy: Tenancy | None  # set by the tenancy ctx; None until it ran
    hot_record: HotRecord | None  # the shared hot-key record, Redis L2 only
