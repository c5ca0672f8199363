"""A stream response whose head goes out with its first body write, for both servers (the gateway's relayed and
replayed streams, the backend's binary token stream).

`prepare` then `write` are two sends where the head could ride with the first frame; a client (or the gateway,
reading the backend) would wake once for the head and again for the frame. Used only where a frame is written right
after `prepare`, so nobody waits on a held head. aiohttp's `web.Response` holds its head the same way for whole
bodies (`_send_headers_immediately`); where a later aiohttp drops the flag, the head is simply sent at `prepare`.
"""

from __future__ import annotations

from aiohttp import web


class HeldHeadResponse(web.StreamResponse):
    _send_headers_immediately = False
