"""Server-sent events (WHATWG HTML §9.2.6): an incremental parser for the upstream's bytes, and the frames we write.

Pure: no I/O. The parser holds only the unfinished line and the event being built between feeds, so the stream is
never buffered as a whole; every complete event is returned as soon as its terminating blank line arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.web.errors import error_body

DONE = b"[DONE]"
DONE_FRAME = b"data: [DONE]\n\n"
HEARTBEAT_FRAME = b": keep-alive\n\n"  # a comment line: every SSE client ignores it, proxies see traffic


@dataclass(frozen=True, slots=True)
class Event:
    data: bytes  # the event's data lines joined with "\n" (HTML §9.2.6 "data buffer")
    name: str | None = None  # the `event:` field, when the upstream sets one


class SSEParser:
    def __init__(self) -> None:
        self._pending = b""  # an unfinished line (or a trailing CR that may be the first half of CRLF)
        self._data: list[bytes] = []
        self._name: str | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        """The events completed by `chunk`, in order."""
        text = self._pending + chunk
        lines = text.splitlines(keepends=True)  # bytes.splitlines splits on LF, CRLF and CR only
        self._pending = b""
        if lines and not lines[-1].endswith(b"\n"):
            self._pending = lines.pop()  # unterminated, or a CR whose LF may come in the next chunk
        events: list[Event] = []
        for line in lines:
            event = self._line(line.rstrip(b"\r\n"))
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[Event]:
        """Flush at end of input; HTML §9.2.6: an event without its blank line at EOF is discarded."""
        pending, self._pending = self._pending, b""
        if pending.endswith(b"\r"):
            event = self._line(pending.rstrip(b"\r"))
            return [event] if event is not None else []
        return []

    def _line(self, line: bytes) -> Event | None:
        if not line:
            if not self._data:
                self._name = None
                return None
            event = Event(b"\n".join(self._data), self._name)
            self._data, self._name = [], None
            return event
        if line.startswith(b":"):
            return None  # a comment (the upstream's own keep-alive)
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._name = value.decode("utf-8", "replace")
        return None  # `id:` and `retry:` do not concern a completion stream


def data_frame(payload: bytes, name: str | None = None) -> bytes:
    """One SSE event carrying `payload` (a payload with newlines becomes several data lines)."""
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"".join(b"data: " + line + b"\n" for line in payload.split(b"\n")) + b"\n"


def error_frame(message: str, *, type_: str, code: str | None) -> bytes:
    """An OpenAI-style error event: the official clients raise an APIError when a data payload has `error`."""
    return data_frame(error_body(message, type_=type_, code=code))
