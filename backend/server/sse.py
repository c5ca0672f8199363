"""Server-sent events for OpenAI streams: `data: {json}` frames and the final `data: [DONE]`.

No compression and `X-Accel-Buffering: no`, so proxies (and the gateway's CDN) pass tokens on at once.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await response.prepare(request)
    return response


async def send_event(response: web.StreamResponse, payload: dict[str, Any], event: str | None = None) -> None:
    """One frame; `event` names it (`event: response.created`), as the Responses stream does."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    name = f"event: {event}\n" if event else ""
    await response.write(f"{name}data: {data}\n\n".encode())


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
