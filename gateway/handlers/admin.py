"""Admin endpoints: purge by key or tag across L1, L2, every other process's L1 and the configured CDNs (design §6).

Tags are named as stored (`model:my model`) or as a tag header spells them (`model:my%20model`); both reach the
entry. The result counts per tier; `bus` is how many other processes confirmed they applied the purge before
the answer (bounded wait; "error" when the bus was unreachable).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from cdn.tags import purge_tag_forms
from gateway.handlers.tenancy import require_admin
from gateway.keys.derive import parse_key
from gateway.keys.validate import parse_object, read_body
from gateway.state import STATE
from gateway.tiers.coherence.coherence import purge_everywhere
from gateway.web.errors import BadRequest

MAX_PURGE_ITEMS = 10_000


def _strings(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRequest(f"'{name}' must be a list of non-empty strings", param=name)
    if len(value) > MAX_PURGE_ITEMS:
        raise BadRequest(f"'{name}' holds more than {MAX_PURGE_ITEMS} items", param=name)
    return value


async def purge(request: web.Request) -> web.Response:
    state = request.app[STATE]
    require_admin(request.headers, state.config.server.admin_token)
    body = parse_object(await read_body(request, state.config.server.max_body_bytes))
    keys, tags = _strings(body, "keys"), _strings(body, "tags")
    if not keys and not tags:
        raise BadRequest("give 'keys' and/or 'tags' to purge")
    bad = [k for k in keys if parse_key(k) is None]
    if bad:
        raise BadRequest(f"not a tokenedge cache key: {bad[0][:100]!r}", param="keys")
    tags = purge_tag_forms(tags)
    # P5 (docs/coherence.md): L2, this L1, then every other L1, confirmed over the bus before we answer.
    result: dict[str, Any] = dict(
        await purge_everywhere(
            state.cache,
            state.coherence,
            tuple(keys),
            tuple(tags),
            ack_timeout_s=state.config.cache.redis_timeout_s * 4,
        )
    )
    if state.cdn_purge is not None:
        # Each CDN client turns a key into its `key:{digest}` tag itself; one CDN's failure is reported, not fatal.
        result["cdn"] = await state.cdn_purge(keys, tags)
    return web.Response(body=orjson.dumps({"purged": result}), content_type="application/json")
