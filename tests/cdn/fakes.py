"""Local stand-ins for the CDN purge APIs: small aiohttp apps on 127.0.0.1 that record every request and
check it against the provider's public documentation (method, path, auth, headers, body shape).

A request that breaks the documented contract is recorded in `violations` and answered 400 (never
retried), so a test fails loudly. `queue()` scripts the next replies (503, 429 + Retry-After, ...), and
`delay_s` stalls a reply to exercise the client's timeout.

The Akamai fake verifies EdgeGrid signatures with its own implementation below, written from the public
description (https://techdocs.akamai.com/developer/docs/authenticate-with-edgegrid), independent of
`cdn.purge.edgegrid`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

KEY = "te1:pub:" + "ab" * 32
KEY_TAG = "key:" + "ab" * 32


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int
    body: object = None
    headers: dict[str, str] = field(default_factory=dict)


class Fake:
    """Base: record, validate (subclass), then answer with a queued reply or the success reply."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self._queue: list[Reply] = []
        self.delay_s = 0.0
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._handle)

    def queue(self, *replies: Reply) -> None:
        self._queue.extend(replies)

    async def _handle(self, request: web.Request) -> web.Response:
        rec = Recorded(request.method, request.path_qs, dict(request.headers), await request.read())
        reply = await self.answer(rec, request.scheme, request.host)
        if isinstance(reply.body, bytes | str):
            return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        return web.json_response(reply.body, status=reply.status, headers=reply.headers)

    async def answer(self, rec: Recorded, scheme: str, host: str) -> Reply:
        self.requests.append(rec)
        problems = self.validate(rec, scheme, host)
        if problems:
            self.violations.extend(problems)
            return Reply(400, {"violations": problems})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self._queue.pop(0) if self._queue else self.success(rec)

    def validate(self, rec: Recorded, scheme: str, host: str) -> list[str]:
        raise NotImplementedError

    def success(self, rec: Recorded) -> Reply:
        raise NotImplementedError


class FakeFastly(Fake):
    """https://www.fastly.com/documentation/reference/api/purging/ (bulk purge by surrogate key)."""

    def __init__(self, api_token: str, service_id: str) -> None:
        super().__init__()
        self.api_token = api_token
        self.service_id = service_id

    def validate(self, rec: Recorded, scheme: str, host: str) -> list[str]:
        p = []
        if rec.method != "POST":
            p.append(f"method {rec.method}")
        if rec.path != f"/service/{self.service_id}/purge":
            p.append(f"path {rec.path}")
        if rec.headers.get("Fastly-Key") != self.api_token:
            p.append("bad Fastly-Key")
        if "Authorization" in rec.headers:
            p.append("Fastly uses Fastly-Key, not Authorization")
        keys = rec.headers.get("Surrogate-Key", "").split(" ")
        if not all(keys) or not 1 <= len(keys) <= 256:
            p.append(f"Surrogate-Key must hold 1..256 space-separated keys, got {len(keys)}")
        if any(len(k.encode()) > 1024 for k in keys):
            p.append("surrogate key over 1 KB")
        if rec.headers.get("Fastly-Soft-Purge", "1") != "1":
            p.append("Fastly-Soft-Purge must be 1")
        return p

    def success(self, rec: Recorded) -> Reply:
        keys = rec.headers["Surrogate-Key"].split(" ")
        return Reply(200, {k: f"108-1391560174-{i}" for i, k in enumerate(keys)})

    def keys(self) -> list[str]:
        return [k for r in self.requests for k in r.headers["Surrogate-Key"].split(" ")]


class FakeCloudflare(Fake):
    """https://developers.cloudflare.com/api/go/resources/cache/methods/purge and
    https://developers.cloudflare.com/cache/how-to/purge-cache/ (100 operations per request)."""

    def __init__(self, api_token: str, zone_id: str) -> None:
        super().__init__()
        self.api_token = api_token
        self.zone_id = zone_id

    def validate(self, rec: Recorded, scheme: str, host: str) -> list[str]:
        p = []
        if rec.method != "POST":
            p.append(f"method {rec.method}")
        if rec.path != f"/client/v4/zones/{self.zone_id}/purge_cache":
            p.append(f"path {rec.path}")
        if rec.headers.get("Authorization") != f"Bearer {self.api_token}":
            p.append("bad Authorization")
        if not rec.headers.get("Content-Type", "").startswith("application/json"):
            p.append("Content-Type must be application/json")
        try:
            body = rec.json()
        except ValueError:
            return [*p, "body is not JSON"]
        if not isinstance(body, dict) or set(body) != {"tags"}:
            return [*p, f"body must be exactly {{'tags': [...]}}, got {body!r}"]
        tags = body["tags"]
        if not isinstance(tags, list) or not 1 <= len(tags) <= 100:
            p.append("tags must be a list of 1..100")
        elif not all(isinstance(t, str) and t and "," not in t and " " not in t for t in tags):
            p.append("tags must be non-empty strings without commas or spaces")
        return p

    def success(self, rec: Recorded) -> Reply:
        return Reply(
            200,
            {
                "success": True,
                "errors": [],
                "messages": [],
                "result": {"id": "9a7806061c88ada191ed06f989cc3dac"},
            },
        )

    def tags(self) -> list[str]:
        return [t for r in self.requests for t in r.json()["tags"]]  # type: ignore[index]


_AKAMAI_AUTH = re.compile(
    r"^EG1-HMAC-SHA256 client_token=(?P<ct>[^;]+);access_token=(?P<at>[^;]+);"
    r"timestamp=(?P<ts>\d{8}T\d{2}:\d{2}:\d{2}\+0000);nonce=(?P<nonce>[^;]+);signature=(?P<sig>[A-Za-z0-9+/=]+)$"
)
_AKAMAI_TAG = re.compile(r"^[A-Za-z0-9!#$%&'^`|~_.+-]{1,128}$")


def eg1_signature(
    method: str, scheme: str, host: str, path_qs: str, body: bytes, secret: str, auth_prefix: str, ts: str
) -> str:
    """Independent EG1-HMAC-SHA256 recomputation (no signed headers, max body 128 KiB)."""
    key = base64.b64encode(hmac.new(secret.encode(), ts.encode(), hashlib.sha256).digest())
    chash = (
        base64.b64encode(hashlib.sha256(body[:131072]).digest()).decode() if method == "POST" and body else ""
    )
    data = "\t".join([method, scheme, host, path_qs, "", chash, auth_prefix])
    return base64.b64encode(hmac.new(key, data.encode(), hashlib.sha256).digest()).decode()


class FakeAkamai(Fake):
    """https://techdocs.akamai.com/purge-cache/reference/api (Fast Purge v3, invalidate/delete by cache tag)."""

    def __init__(self, client_token: str, client_secret: str, access_token: str) -> None:
        super().__init__()
        self.client_token = client_token
        self.client_secret = client_secret
        self.access_token = access_token
        self.nonces: list[str] = []

    def validate(self, rec: Recorded, scheme: str, host: str) -> list[str]:
        p = []
        if rec.method != "POST":
            p.append(f"method {rec.method}")
        if not re.fullmatch(r"/ccu/v3/(invalidate|delete)/tag/(production|staging)", rec.path):
            p.append(f"path {rec.path}")
        if not rec.headers.get("Content-Type", "").startswith("application/json"):
            p.append("Content-Type must be application/json")
        if len(rec.body) > 50_000:
            p.append("body over 50,000 bytes")
        m = _AKAMAI_AUTH.match(rec.headers.get("Authorization", ""))
        if m is None:
            return [*p, "Authorization is not an EG1-HMAC-SHA256 header"]
        if (m["ct"], m["at"]) != (self.client_token, self.access_token):
            p.append("unknown client or access token")
        if m["nonce"] in self.nonces:
            p.append("nonce reused")
        self.nonces.append(m["nonce"])
        prefix = rec.headers["Authorization"][: m.start("sig") - len("signature=")]
        expected = eg1_signature(
            rec.method, scheme, host, rec.path, rec.body, self.client_secret, prefix, m["ts"]
        )
        if not hmac.compare_digest(expected, m["sig"]):
            p.append("signature mismatch")
        body = json.loads(rec.body or b"null")
        if not isinstance(body, dict) or set(body) != {"objects"} or not isinstance(body["objects"], list):
            return [*p, "body must be exactly {'objects': [...]}"]
        bad = [t for t in body["objects"] if not isinstance(t, str) or not _AKAMAI_TAG.match(t)]
        if bad or not body["objects"]:
            p.append(f"invalid cache tags {bad[:3]}")
        return p

    def success(self, rec: Recorded) -> Reply:
        return Reply(
            201,
            {
                "httpStatus": 201,
                "detail": "Request accepted",
                "estimatedSeconds": 5,
                "purgeId": "edcp-NZbXzFpHBjcJeryhw6PVgG",
                "supportId": "edcp-NZbXzFpHBjcJeryhw6PVgG",
            },
        )

    def objects(self) -> list[str]:
        return [t for r in self.requests for t in r.json()["objects"]]  # type: ignore[index]


class FakeVarnish(Fake):
    """The purge contract our VCL implements (cdn/README.md): PURGE + xkey-purge / xkey-softpurge
    (vmod_xkey), or BAN + X-Ban-Tags; X-Purge-Token when a token is configured."""

    def __init__(self, token: str | None = None) -> None:
        super().__init__()
        self.token = token

    def validate(self, rec: Recorded, scheme: str, host: str) -> list[str]:
        p = []
        if self.token is not None and rec.headers.get("X-Purge-Token") != self.token:
            p.append("bad X-Purge-Token")
        headers = {"PURGE": ("xkey-purge", "xkey-softpurge"), "BAN": ("X-Ban-Tags",)}.get(rec.method)
        if headers is None:
            return [*p, f"method {rec.method}"]
        present = [h for h in headers if h in rec.headers]
        if len(present) != 1:
            p.append(f"need exactly one of {headers}")
        elif not all(rec.headers[present[0]].split(" ")):
            p.append("tags must be single-space separated")
        return p

    def success(self, rec: Recorded) -> Reply:
        return Reply(200, "purged", {"Content-Type": "text/plain"})


@asynccontextmanager
async def serve(fake: Fake) -> AsyncIterator[str]:
    """Run `fake` on 127.0.0.1 (ephemeral port); yields its base URL without a trailing slash."""
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@asynccontextmanager
async def serve_raw(fake: Fake) -> AsyncIterator[str]:
    """Minimal HTTP/1.1 listener for methods aiohttp's server parser refuses (Varnish's BAN): one request
    per connection, Content-Length bodies only. Real Varnish accepts any method token."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = dict(line.split(": ", 1) for line in head[1:] if line)
        body = await reader.readexactly(int(headers.get("Content-Length", "0")))
        host = headers.get("Host", "")
        reply = await fake.answer(Recorded(method, path, headers, body), "http", host)
        data = reply.body if isinstance(reply.body, bytes) else str(reply.body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
        writer.write(
            f"HTTP/1.1 {reply.status} X\r\nContent-Length: {len(data)}\r\nConnection: close\r\n{extra}\r\n".encode()
        )
        writer.write(data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def client_session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class RecordingSleep:
    """Injected instead of asyncio.sleep: records the delays, never sleeps."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)


class MaxJitter:
    """Injected RNG whose uniform(a, b) returns b, making backoff delays predictable."""

    def uniform(self, a: float, b: float) -> float:
        return b
