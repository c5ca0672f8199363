"""Fan a purge out to every configured CDN at once. One CDN's failure, even an exception, is reported in
its own result and never stops or fails the others (issue 5: "one CDN's failure is reported, not fatal")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from cdn.purge.base import PurgeClient, PurgeResult

__all__ = ["fan_out"]

logger = logging.getLogger(__name__)


async def fan_out(
    clients: Sequence[PurgeClient], keys: Sequence[str], tags: Sequence[str]
) -> dict[str, PurgeResult]:
    """Purge `keys` and `tags` on every client concurrently; results keyed by client name."""
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise ValueError(f"purge client names must be unique, got {names}")
    results = await asyncio.gather(*(_guarded(c, keys, tags) for c in clients))
    return dict(zip(names, results, strict=True))


async def _guarded(client: PurgeClient, keys: Sequence[str], tags: Sequence[str]) -> PurgeResult:
    try:
        return await client.purge(keys, tags)
    except Exception as exc:  # the client's own bug: report it, never let it sink the other CDNs
        # Only the exception type: its message could carry a credential the client failed to redact.
        logger.error("purge via %s raised %s", client.name, type(exc).__name__)
        return PurgeResult(
            cdn=client.name, ok=False, purged=0, requests=0, errors=(f"unexpected {type(exc).__name__}",)
        )
