"""Raw-socket HTTP/1.1 for edge tests: send exact bytes (no client library normalizes the path), read what comes back.

`exchange` writes the bytes, reads until the server closes (or `timeout_s` passes, which fails the test), and parses
every response on the connection: status, headers and the de-chunked body.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names; the last value wins
    body: bytes = b""

    def json(self) -> Any:
        return orjson.loads(self.body)

    def is_openai_error(self) -> bool:
        """`application/json` with `{"error": {"message": str, "type": str, ...}}`."""
        if not self.headers.get("content-type", "").startswith("application/json"):
            return False
        try:
            doc = self.json()
        except orjson.JSONDecodeError:
            return False
        error = doc.get("error") if isinstance(doc, dict) else None
        return (
            isinstance(error, dict)
            and isinstance(error.get("message"), str)
            and isinstance(error.get("type"), str)
        )


def request_bytes(
    method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: gateway.test", "Connection: close"]
    merged = dict(headers or {})
    if body and "Content-Length" not in merged and "Transfer-Encoding" not in merged:
        merged["Content-Length"] = str(len(body))
    lines += [f"{k}: {v}" for k, v in merged.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def exchange(
    port: int, data: bytes, *, timeout_s: float = 30.0, host: str = "127.0.0.1"
) -> list[RawResponse]:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        async with asyncio.timeout(timeout_s):
            raw = await reader.read(-1)
    except (ConnectionResetError, BrokenPipeError):
        raw = b""
    finally:
        writer.close()
    return parse_responses(raw)


def parse_responses(raw: bytes, *, head_request: bool = False) -> list[RawResponse]:
    """Every response in `raw`; `head_request`: the first answers a HEAD (no body, whatever its framing says,
    unless the server could not parse the request and so answers a HEAD it never saw, with a body)."""
    out: list[RawResponse] = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            raise AssertionError(f"truncated response head: {raw[:200]!r}")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        bodiless_head = head_request and not out and (not rest or rest.startswith(b"HTTP/"))  # a parse error
        if (
            bodiless_head or 100 <= status < 200 or status in (204, 304)
        ):  # answers a HEAD it never saw with a body
            body = b""
            raw = rest
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body, raw = _dechunk(rest)
        elif "content-length" in headers:
            size = int(headers["content-length"])
            body, raw = rest[:size], rest[size:]
        else:
            body, raw = rest, b""
        out.append(RawResponse(status, headers, body))
    return out


def _dechunk(data: bytes) -> tuple[bytes, bytes]:
    body = bytearray()
    while True:
        line, _, data = data.partition(b"\r\n")
        size = int(line.split(b";")[0] or b"0", 16)
        if size == 0:
            _, _, data = data.partition(b"\r\n")
            return bytes(body), data
        body += data[:size]
        data = data[size + 2 :]


async def ask_kept_alive(url: str, target: str, headers: list[tuple[str, str]], body: bytes) -> RawResponse:
    """One POST as raw bytes in one write on a keep-alive connection (what the gateway's fast lane takes), its
    response read whole (h11 frames it), then the connection closed by us."""
    import h11  # test-only dependency, as the lane tests use it

    lines = [f"POST {target} HTTP/1.1", "Host: gateway.test", *(f"{k}: {v}" for k, v in headers)]
    head = "\r\n".join([*lines, f"Content-Length: {len(body)}"]) + "\r\n\r\n"
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode("latin-1") + body)
    conn = h11.Connection(h11.CLIENT)
    out = RawResponse(0)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), 30))
            elif isinstance(event, h11.Response):
                out.status = event.status_code
                out.headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                out.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return out
    finally:
        writer.close()
