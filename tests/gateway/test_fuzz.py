"""A seeded fuzz run over raw sockets: 10,000 malformed, hostile or merely odd requests leave the gateway healthy.

Each case mutates a request line, headers, framing and body (traversal spellings, bad percent-encoding, odd methods
and versions, Content-Length and Transfer-Encoding lies, credentials of every kind, JSON with wrong types, depth and
size). Properties: no 5xx but the documented ones, no traceback or error log from the gateway, every 4xx is an
OpenAI-style JSON error (the upstream here answers JSON too, so any other 4xx body would be the gateway's), and the
gateway still serves normal requests afterwards. The seed makes a failure reproducible (`FUZZ_SEED`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tests.support.rawhttp import RawResponse, parse_responses

CASES = 10_000
SEED = int(os.environ.get("FUZZ_SEED", "20261130"))
FAKE_LOG = "fake.upstream"
DOCUMENTED_5XX = {(504, "only_if_cached")}  # RFC 9111 §5.2.1.7 on a miss; the upstream here never fails

PATHS = (
    ["/v1/chat/completions"] * 12
    + ["/v1/completions"] * 3
    + ["/v1/embeddings"] * 3
    + [
        "/v1/models",
        "/v1/models/test-model",
        "/v1/cache/explain",
        "/v1/cache/te1:anon:" + "0" * 64,
        "/v1/cache/nope",
        "/v1/files",
        "/v1/responses",
        "/v1/unknown/route",
        "/health",
        "/ready",
        "/metrics",
        "/dashboard",
        "/dashboard/data",
        "/admin/purge",
        "/",
        "/v1",
        "/v2/chat/completions",
    ]
)
METHODS = [b"GET"] * 4 + [b"POST"] * 14 + [b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD"]
ODD_METHODS = [b"TRACE", b"CONNECT", b"PRI", b"get", b"G@T", b"POST\x00", b"\xff\xfe", b"X" * 40, b"PROPFIND"]
VERSIONS = [b"HTTP/1.1"] * 60 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.x", b"http/1.1", b"HTTP/1.1 extra", b""]
PATH_MUTATIONS = [
    "/..",
    "/../..",
    "/%2e%2e",
    "/.%2E",
    "//",
    "\\..",
    "/%5c..",
    ";x=1",
    "/..;",
    "%2f..",
    "%252e",
    "%",
    "%zz",
    "%00",
    "%c0%ae",
    "/" + "a" * 9000,
    "/\u00e9",
    "%C3%A9",
    "/./",
    "?q=/../x",
    "#frag",
    "?" + "a=1&" * 50,
    "/%0d%0aX-Injected:%201",
    " ",
    "\t",
]
CREDENTIALS = [
    {"Authorization": "Bearer sk-a"},
    {"Authorization": "Basic dTpw"},
    {"Authorization": "Bearer "},
    {"Authorization": "Token x"},
    {"api-key": "k"},
    {"x-api-key": "k"},
    {"OpenAI-Organization": "o"},
    {"OpenAI-Project": "p"},
    {"Authorization": "Bearer \u00e9"},
    {},
]
ODD_VALUES = [
    None,
    True,
    False,
    -1,
    0,
    1,
    2,
    2**63 - 1,
    1.5,
    -0.0,
    "x",
    "",
    [],
    {},
    [1, "a"],
    {"a": {"b": []}},
    "\u0000\ud7ff",
    "a" * 5000,
]
FIELDS = [
    "model",
    "messages",
    "temperature",
    "n",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "top_p",
    "logprobs",
    "tools",
    "response_format",
    "stream_options",
    "user",
    "prompt",
    "input",
    "echo",
]


def json_body(rng: random.Random, path: str) -> bytes:
    roll = rng.random()
    if roll < 0.05:
        return b"[" * rng.choice([10, 70, 5000]) + b"]" * rng.choice([0, 10, 70])
    if roll < 0.1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if roll < 0.13:
        return b'{"model": "test-model", "messages": [' + b"\xff\xfe" + b"]}"
    body: dict[str, object] = {**CHAT, "messages": [{"role": "user", "content": f"fuzz {rng.randrange(50)}"}]}
    if path.endswith("/v1/completions"):
        body = {"model": "test-model", "temperature": 0, "prompt": f"fuzz {rng.randrange(50)}"}
    elif path.endswith("/v1/embeddings"):
        body = {"model": "test-model", "input": f"fuzz {rng.randrange(50)}"}
    if rng.random() < 0.3:
        body["stream"] = True
    for _ in range(rng.choice([0, 0, 1, 1, 2, 4])):
        body[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
    if rng.random() < 0.1:
        body["messages"] = [
            {
                "role": rng.choice(["user", "system", "tool", "x", 1]),
                "content": rng.choice([*ODD_VALUES, [{"type": "text", "text": "a"}]]),
            }
        ]
    if rng.random() < 0.05:
        return orjson.dumps({"endpoint": rng.choice(["chat/completions", "x"]), "request": body})
    return orjson.dumps(body)


def target(rng: random.Random, path: str) -> bytes:
    for _ in range(rng.choice([0, 0, 0, 0, 0, 0, 1, 1, 2])):
        mutation = rng.choice(PATH_MUTATIONS)
        at = rng.randrange(len(path) + 1)
        path = path[:at] + mutation + path[at:]
    if rng.random() < 0.03:
        path = "http://evil.test" + path
    return path.encode("utf-8", "surrogateescape")


CONTENT_TYPES = [
    b"Content-Type: application/json",
    b"Content-Type: application/json; charset=utf-8",
    b"Content-Type: text/plain",
    b"Content-Type: application/vnd.x+json",
    b"Content-Type: ;;",
    b"",
    b"Content-Type: application/json",
    b"Content-Type: application/json",
]
BIG = b"X-Big: "  # padded to a size drawn with it
EXTRA_HEADERS = [
    b"Cache-Control: no-cache",
    b"Cache-Control: no-store",
    b"Cache-Control: max-age=0",
    b"Cache-Control: only-if-cached",
    b"Cache-Control: max-age=abc, ,,",
    b"Pragma: no-cache",
    b"If-None-Match: *",
    b"X-Tokenedge-Debug: 1",
    b"X-Forwarded-For: 1.2.3.4",
    b"Accept-Encoding: gzip, br",
    b"Expect: 100-continue",
    b"Upgrade: websocket",
    BIG,
    b"Bad Header: x",
    b"X-Nul: a\x00b",
    b"X-Latin: \xe9",
    b": empty-name",
    b"X-Fold: a\r\n folded",
]
BAD_LENGTHS = [
    b"Content-Length: -1",
    b"Content-Length: 1e3",
    b"Content-Length: 99999999999999999",
    b"Content-Length: 5, 5",
    b"Content-Length: +5",
]
ODD_ENCODINGS = [
    b"Transfer-Encoding: gzip",
    b"Transfer-Encoding: chunked, chunked",
    b"Transfer-Encoding: chunked\r\nContent-Length: 3",
    b"Transfer-Encoding: \x0bchunked",
]


def headers(rng: random.Random, body: bytes) -> list[bytes]:
    out = [b"Host: gateway.test", b"Connection: close"]
    out += [f"{k}: {v}".encode() for k, v in rng.choice(CREDENTIALS).items()]
    out.append(rng.choice(CONTENT_TYPES))
    if rng.random() < 0.2:
        size = rng.choice(
            [100, 9000, 20000]
        )  # drawn before the pick, in every case: a seed replays the same run
        extra = rng.choice(EXTRA_HEADERS)
        out.append(extra + b"b" * size if extra == BIG else extra)
    out.append(framing(rng, body))
    return out


def framing(rng: random.Random, body: bytes) -> bytes:
    """The body's length header: mostly right, sometimes a lie, a chunked body or an odd transfer coding."""
    roll = rng.random()
    if roll < 0.8:
        return b"Content-Length: " + str(len(body)).encode()
    if roll < 0.84:
        return b"Content-Length: " + str(len(body) + rng.randrange(1, 100)).encode()  # a body that never ends
    if roll < 0.87:
        return b"Content-Length: " + str(max(0, len(body) - rng.randrange(1, 10))).encode()
    if roll < 0.9:
        return rng.choice(BAD_LENGTHS)
    if roll < 0.95:
        return b"Transfer-Encoding: chunked"
    return rng.choice(ODD_ENCODINGS)


def case(rng: random.Random) -> tuple[bytes, bytes]:
    method = rng.choice(METHODS if rng.random() < 0.93 else ODD_METHODS)
    path = rng.choice(PATHS)
    if method == b"POST" and rng.random() < 0.5:
        path = rng.choice(PATHS[:18])
    body = json_body(rng, path) if method in (b"POST", b"PUT", b"PATCH") or rng.random() < 0.05 else b""
    head = headers(rng, body)
    if any(h.startswith(b"Transfer-Encoding: chunked") for h in head) and rng.random() < 0.8:
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:7], body[7:]) if p) + b"0\r\n\r\n"
        if rng.random() < 0.2:
            body = body.replace(b"\r\n", b"\n", 1)
    line = method + b" " + target(rng, path) + (b" " + rng.choice(VERSIONS) if rng.random() < 0.99 else b"")
    return method, line + b"\r\n" + b"\r\n".join(h for h in head if h) + b"\r\n\r\n" + body


@pytest.fixture
async def json_upstream(fake: FakeUpstream) -> AsyncIterator[str]:
    """The fake upstream, answering unknown routes with an OpenAI-style 404 (so every 4xx in the run is JSON)."""

    async def unknown(_request: web.Request) -> web.Response:
        return web.json_response(
            {
                "error": {
                    "message": "no such route",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "unknown_url",
                }
            },
            status=404,
        )

    app = fake.app()
    app.router.add_route("*", "/{tail:.*}", unknown)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(logger=logging.getLogger(FAKE_LOG))
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def send(port: int, data: bytes, method: bytes) -> tuple[list[RawResponse], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = b""
    try:
        writer.write(data)
        async with asyncio.timeout(30):  # a hang guard: the deadlines close every connection well before
            raw = await reader.read(-1)
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    return parse_responses(raw, head_request=method == b"HEAD"), raw


def problems_of(method: bytes, responses: list[RawResponse], raw: bytes) -> list[str]:
    if not responses:
        return [f"no answer (raw {raw[:80]!r})"]
    found = []
    for r in responses:
        code = r.json()["error"].get("code") if r.is_openai_error() else None
        if r.status >= 500 and (r.status, code) not in DOCUMENTED_5XX:
            found.append(f"{r.status} {r.body[:120]!r}")
        elif 400 <= r.status < 500 and method != b"HEAD" and not r.is_openai_error():
            found.append(f"{r.status} not JSON: {r.headers.get('content-type')} {r.body[:120]!r}")
    return found


async def test_ten_thousand_fuzzed_requests_leave_the_gateway_healthy(
    make_gateway: GatewayFactory, json_upstream: str, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(
        json_upstream,
        server={
            "header_read_timeout_s": 0.5,
            "header_total_s": 1.0,
            "body_read_timeout_s": 0.5,
            "body_total_s": 1.0,
            "max_body_bytes": 65536,
            "admin_token": "fuzz-admin",
        },
    )
    port = gw.server.port
    assert port is not None
    rng = random.Random(SEED)
    cases = [case(rng) for _ in range(CASES)]
    limit = asyncio.Semaphore(32)
    failures: list[tuple[int, bytes, list[str]]] = []
    statuses: dict[int, int] = {}

    async def run(index: int, method: bytes, data: bytes) -> None:
        async with limit:
            responses, raw = await send(port, data, method)
        for r in responses:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        problems = problems_of(method, responses, raw)
        if problems:
            failures.append((index, data[:200], problems))

    with caplog.at_level(logging.INFO):
        await asyncio.gather(*(run(i, m, d) for i, (m, d) in enumerate(cases)))

    assert failures[:5] == [], (
        f"{len(failures)} failing cases (seed {SEED}); statuses {sorted(statuses.items())}"
    )
    gateway_logs = [
        r for r in caplog.records if r.name != FAKE_LOG and (r.exc_info or r.levelno >= logging.ERROR)
    ]
    assert gateway_logs == []
    assert statuses.get(200, 0) > 500 and statuses.get(400, 0) > 1000  # the run reached handlers and refusals
    healthy = await gw.client.get("/health")
    normal = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert healthy.status == 200 and normal.status == 200
