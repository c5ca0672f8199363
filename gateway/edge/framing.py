"""Where requests begin and end on a connection, counted as bytes go by (pure: no I/O, no aiohttp).

The fast lane may answer a request only when everything sent before it on the connection has been answered,
so it needs two facts aiohttp keeps privately: how many requests have started, and whether the bytes fed so far end
on a request boundary. `Framer` tracks both from the bytes themselves (a request head ends at the first CRLFCRLF; a
`Content-Length` body follows it). Anything it cannot frame with certainty (chunked bodies, upgrades, a repeated or
odd `Content-Length`, a huge head, bytes that do not start like a request line) turns it `raw` for good: the lane then
leaves the connection to aiohttp alone.
"""

from __future__ import annotations

import re

MAX_HEAD_BYTES = 64 * 1024
_REQUEST_LINE = re.compile(rb"[A-Z]{3,10} \S+ HTTP/1\.[01]\Z")


def body_length(head: bytes) -> int | None:
    """The Content-Length body that follows `head` (request line and fields, without the final CRLFCRLF); None
    when the framing is not a plain, single Content-Length (or none)."""
    lines = head.split(b"\r\n")
    if not _REQUEST_LINE.match(lines[0]):
        return None
    length: int | None = None
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        lower = name.lower()
        if not sep or lower in (b"transfer-encoding", b"upgrade"):
            return None
        if lower == b"content-length":
            digits = value.strip(b" \t")
            if length is not None or not digits.isdigit() or len(digits) > 12:
                return None
            length = int(digits)
    return length or 0


class Framer:
    __slots__ = ("body_left", "head", "raw", "started")

    def __init__(self) -> None:
        self.raw = False  # framing given up: the lane never answers on this connection again
        self.head = b""  # the part of a request head seen so far
        self.body_left = 0  # body bytes of the current request still to come
        self.started = 0  # requests whose head has begun

    def at_boundary(self) -> bool:
        """Every byte seen so far belongs to a complete request: the next byte starts a new one."""
        return not self.raw and not self.head and self.body_left == 0

    def scan(self, data: bytes) -> None:
        """Account for `data`, the next bytes of the connection."""
        pos, size = 0, len(data)
        while pos < size and not self.raw:
            if self.body_left:
                step = min(self.body_left, size - pos)
                self.body_left -= step
                pos += step
                continue
            if not self.head:
                self.started += 1  # a new request's first byte
            seen = len(self.head)
            buffer = self.head + data[pos:]
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self.raw = True
                self.head = buffer
                return
            length = body_length(buffer[:end])
            self.head = b""
            if length is None:
                self.raw = True
                return
            self.body_left = length
            pos += end + 4 - seen
