"""What intake reads of the gateway's state (a port: the shell's `GatewayState` provides it)."""

from __future__ import annotations

from typing import Protocol

from gateway.hits.needs import HitState
from gateway.keys.memo import RequestMemo
from gateway.keys.policy import RoutePolicy
from gateway.tokens.needs import TokenState
from gateway.upstream.catalog import ModelCatalog


class IntakeState(HitState, TokenState, Protocol):
    memo: RequestMemo
    policies: dict[str, RoutePolicy]  # per cacheable endpoint
    catalog: ModelCatalog
