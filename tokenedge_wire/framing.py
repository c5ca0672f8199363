"""The binary token transport's wire format (`application/vnd.tokenedge.tokens`), shared by gateway and backend.

Request body:  b"TET1" | u32 LE header length H | H bytes of UTF-8 JSON header | k * int32 LE token ids
Response body (`application/vnd.tokenedge.events`): a sequence of frames, each u32 LE length L | L bytes JSON:
    {"meta": {...}} first, then {"i": choice, "t": text, "f": finish_reason} per text event, then
    {"usage": {...}} last, or {"error": {...}} when generation fails after the first event.
Pure functions, no I/O: `decode_request` raises `WireError` (the server's 400) on any malformed body.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

REQUEST_TYPE = "application/vnd.tokenedge.tokens"
EVENTS_TYPE = "application/vnd.tokenedge.events"
MAGIC = b"TET1"
MAX_HEADER_BYTES = 64 * 1024
_U32 = struct.Struct("<I")


class WireError(ValueError):
    """A malformed binary body; the message says what is wrong (rendered as a 400)."""


def encode_request(header: dict[str, Any], ids: Sequence[int]) -> bytes:
    head = orjson.dumps(header)
    body = array("i", ids)
    if sys.byteorder != "little":
        body.byteswap()
    return b"".join((MAGIC, _U32.pack(len(head)), head, body.tobytes()))


def decode_request(body: bytes) -> tuple[dict[str, Any], array[int]]:
    """(header, ids) of a request body; every length is checked before it is trusted."""
    if len(body) < 8 or body[:4] != MAGIC:
        raise WireError("the body must start with the 4-byte magic TET1 and a 4-byte header length")
    (head_len,) = _U32.unpack_from(body, 4)
    if head_len > MAX_HEADER_BYTES:
        raise WireError(f"the header length {head_len} exceeds {MAX_HEADER_BYTES} bytes")
    if 8 + head_len > len(body):
        raise WireError(f"truncated header: {head_len} bytes announced, {len(body) - 8} present")
    try:
        header = orjson.loads(body[8 : 8 + head_len])
    except orjson.JSONDecodeError:
        raise WireError("the header is not valid JSON") from None
    if not isinstance(header, dict):
        raise WireError("the header must be a JSON object")
    rest = len(body) - 8 - head_len
    if rest % 4:
        raise WireError(f"the token array is {rest} bytes long, not a multiple of 4 (int32 ids)")
    ids = array("i")
    ids.frombytes(body[8 + head_len :])
    if sys.byteorder != "little":
        ids.byteswap()
    return header, ids


def frame(event: dict[str, Any]) -> bytes:
    data = orjson.dumps(event)
    return _U32.pack(len(data)) + data


class FrameReader:
    """Incremental frame parser: feed it chunks as they arrive, get whole events back."""

    __slots__ = ("_buf", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self.max_frame_bytes = max_frame_bytes

    def feed(self, chunk: bytes) -> Iterator[dict[str, Any]]:
        self._buf += chunk
        while len(self._buf) >= 4:
            (size,) = _U32.unpack_from(self._buf, 0)
            if size > self.max_frame_bytes:
                raise WireError(f"an event frame of {size} bytes exceeds {self.max_frame_bytes}")
            if len(self._buf) < 4 + size:
                return
            data = bytes(self._buf[4 : 4 + size])
            del self._buf[: 4 + size]
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise WireError("an event frame is not valid JSON") from None
            if not isinstance(event, dict):
                raise WireError("an event frame is not a JSON object")
            yield event

    @property
    def pending(self) -> int:
        return len(self._buf)
