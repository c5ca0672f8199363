"""Structured access log: one JSON line per sampled request on the cacheable routes, on logger `tokenedge.access`.

Sampled by `server.access_log_sample_rate` (0, the default, is off and costs one comparison per request), so
logging never dominates the hot path. A line never carries a credential: the tenant appears as the scope already
in the key (a BLAKE2b hash of the token, truncated here), and the key only as a prefix.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import orjson

from gateway.ops.timing import StageTimer

log = logging.getLogger("tokenedge.access")
KEY_PREFIX_CHARS = 16  # digest characters kept: enough to grep for, useless to replay
TENANT_CHARS = 12


def sampled(rate: float, draw: Callable[[], float] = random.random) -> bool:
    return rate > 0.0 and (rate >= 1.0 or draw() < rate)


def key_fields(key: str) -> tuple[str, str]:
    """(key prefix, tenant hash) from `te1:{scope}:{digest}`; empty strings when no key was derived."""
    parts = key.split(":", 2)
    if len(parts) != 3:
        return "", ""
    version, scope, digest = parts
    return f"{version}:{scope[:TENANT_CHARS]}:{digest[:KEY_PREFIX_CHARS]}", scope[:TENANT_CHARS]


def record(timer: StageTimer) -> dict[str, object]:
    key_prefix, tenant = key_fields(timer.key)
    return {
        "route": timer.route,
        "result": timer.result,
        "reason": timer.reason,
        "status": timer.status,
        "key": key_prefix,
        "tenant": tenant,
        "duration_ms": round(timer.elapsed() * 1000, 3),
        "ttft_ms": round(timer.ttft() * 1000, 3),
        "stages_ms": {name: round(secs * 1000, 3) for name, secs in timer.stages.items()},
    }


def write(timer: StageTimer, rate: float, draw: Callable[[], float] = random.random) -> None:
    if sampled(rate, draw):
        log.info("%s", orjson.dumps(record(timer)).decode())
