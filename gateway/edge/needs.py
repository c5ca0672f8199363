"""What the edge reads of the gateway's state, and where it finds it on the app: the shell's `GatewayState`
provides it and puts it under `EDGE_STATE` when it is built (gateway.app's cache ctx). A port: the edge knows
the layers below it, never the shell."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from gateway.intake.needs import IntakeState
from gateway.ops.tracing import Tracing


class EdgeState(IntakeState, Protocol):
    """Intake's state: the lane reuses what the intake pipeline memoized."""

    tracing: Tracing | None  # on: a hit carrying a sampled `traceparent` is traced (Tracing.lane_hit)


EDGE_STATE: web.AppKey[EdgeState] = web.AppKey("tokenedge_edge_state")
