"""What a miss reads of the gateway's state: the hit core's and the token path's view, plus the fill's own parts
(a port: the shell's `GatewayState` provides it)."""

from __future__ import annotations

from typing import Protocol

from gateway.hits.needs import HitState
from gateway.misses.lease import Leases
from gateway.misses.streaming.broadcast import StreamFlights
from gateway.tiers.hotrecord import Warmup
from gateway.tokens.needs import TokenState


class MissState(HitState, TokenState, Protocol):
    stream_flights: StreamFlights
    leases: Leases | None  # cross-replica leases, Redis L2 only (misses.lease_fill.lease_ctx)
    warmup: Warmup | None  # the start-up L1 fill's progress (misses.warm.warm_ctx)
