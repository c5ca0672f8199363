"""The usage ask: every cacheable streamed miss asks the upstream for the closing usage chunk.

A hit is the whole answer (design §4): an entry recorded from a stream must hold usage, or a later JSON hit would
lack `usage` and a streamed hit with `include_usage` would lack its usage chunk. So the tee forwards the client's
own bytes with `stream_options.include_usage: true` added, and the relay drops the usage-only chunk for each
client that did not ask for it (`gateway.misses.stream.pipe`). Pure: bytes in, bytes out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.keys.policy import wants_usage

_ASK = b'"stream_options":{"include_usage":true}'


def asking_usage(raw: bytes, body: Mapping[str, Any]) -> tuple[bytes, Mapping[str, Any]]:
    """The request bytes and body to forward: the client's own, with the usage ask when it lacks one.

    Without `stream_options` the ask is spliced in after the opening brace, so every other byte is the client's;
    a `stream_options` without the ask is rewritten as JSON (its other options kept).
    """
    if wants_usage(body):
        return raw, body
    options = body.get("stream_options")
    asked = {
        **body,
        "stream_options": {**(options if isinstance(options, Mapping) else {}), "include_usage": True},
    }
    if "stream_options" in body:
        return orjson.dumps(asked), asked
    start = raw.index(b"{") + 1  # a validated request is a JSON object: its first non-blank byte is the brace
    sep = b"," if body else b""
    return raw[:start] + _ASK + sep + raw[start:], asked
