"""The fast lane answers exactly what the ordinary path answers, for any request bytes (gateway/edge/fastlane.py).

Two gateways with the same entries, one with the lane and one without (`server.fast_lane = false`), get the same
request bytes: hundreds of variants of a known hit's request (header names in any case, odd spacing, repeated,
folded or malformed fields, credentials in other headers or repeated, other content types, `Connection` values,
framing headers, other routes and versions, bodies with a byte changed, cut or extended). Every answer must be the
same on both: status, body, cache key and Cache-Status (but its lane-independent ttl), so the lane can never merge
requests the ordinary path keeps apart, cross callers, or accept what aiohttp refuses.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import orjson
import pytest

from gateway.edge.fastlane import header_kinds, plain_head
from gateway.keys.parts import header_part
from harness.gateway import RunningGateway
from tests.gateway.conftest import GatewayFactory

BODY = orjson.dumps(
    {"model": "test-model", "temperature": 0, "messages": [{"role": "user", "content": "hi there"}]}
)
BASE_FIELDS = [
    ("Host", "gateway.test"),
    ("Authorization", "Bearer tenant-a-key"),
    ("Content-Type", "application/json"),
    ("Content-Length", str(len(BODY))),
]


def render(line: str, fields: list[tuple[str, str]], body: bytes, sep: str = ": ") -> bytes:
    head = line + "\r\n" + "".join(f"{name}{sep}{value}\r\n" for name, value in fields) + "\r\n"
    return head.encode("latin-1") + body


@dataclass
class Request:
    line: str = "POST /v1/chat/completions HTTP/1.1"
    fields: list[tuple[str, str]] = field(default_factory=lambda: list(BASE_FIELDS))
    body: bytes = BODY
    sep: str = ": "


def _pick(rng: random.Random, *options: str) -> str:
    return rng.choice(options)


def _with(name: str, value: str) -> Callable[[Request, random.Random], None]:
    return lambda r, _rng: r.fields.append((name, value))


def _set(name: str, *values: str) -> Callable[[Request, random.Random], None]:
    def mutate(r: Request, rng: random.Random) -> None:
        value = rng.choice(values)
        r.fields = [(n, value if n.lower() == name else v) for n, v in r.fields]

    return mutate


def _recase(r: Request, rng: random.Random) -> None:
    r.fields = [(n.upper() if rng.random() < 0.5 else n.lower(), v) for n, v in r.fields]


def _respace(r: Request, rng: random.Random) -> None:
    r.sep = _pick(rng, ":", ":  ", ":\t", " : ", ": \t ")


def _reline(r: Request, rng: random.Random) -> None:
    r.line = _pick(
        rng,
        "POST /v1/chat/completions HTTP/1.0",
        "post /v1/chat/completions HTTP/1.1",
        "POST /v1/chat/completions?x=1 HTTP/1.1",
        "POST //v1/chat/completions HTTP/1.1",
        "POST /v1/completions HTTP/1.1",
        "POST /v1/chat/completions/ HTTP/1.1",
        "POST /V1/chat/completions HTTP/1.1",
        "PUT /v1/chat/completions HTTP/1.1",
    )


def _rebyte(r: Request, rng: random.Random) -> None:
    i = rng.randrange(len(r.body))
    r.body = r.body[:i] + bytes([rng.randrange(32, 127)]) + r.body[i + 1 :]


def _relength(r: Request, rng: random.Random) -> None:
    delta = rng.choice([-1, 1])
    r.fields = [(n, str(int(v) + delta)) if n == "Content-Length" else (n, v) for n, v in r.fields]


def _drop(r: Request, rng: random.Random) -> None:
    gone = _pick(rng, "host", "content-type", "authorization")
    r.fields = [(n, v) for n, v in r.fields if n.lower() != gone]


def _space(r: Request, _rng: random.Random) -> None:
    r.body = r.body.replace(b"hi there", b"hi there ")


def _shuffle(r: Request, rng: random.Random) -> None:
    rng.shuffle(r.fields)


def _one_of(*mutations: Callable[[Request, random.Random], None]) -> Callable[[Request, random.Random], None]:
    return lambda r, rng: rng.choice(mutations)(r, rng)


MUTATIONS: list[Callable[[Request, random.Random], None]] = [
    _recase,
    _respace,
    _one_of(*(_with("Authorization", v) for v in ("Bearer tenant-a-key", "Bearer tenant-b-key", ""))),
    _one_of(*(_with(n, "k") for n in ("api-key", "X-Api-Key", "OpenAI-Organization", "OpenAI-Project"))),
    _set(
        "content-type",
        "text/plain",
        "application/json; charset=utf-8",
        "application/x+json",
        "APPLICATION/JSON",
        "multipart/form-data",
    ),
    _one_of(*(_with("Connection", v) for v in ("close", "keep-alive", "keep-alive, close"))),
    _one_of(
        _with("Transfer-Encoding", "chunked"),
        _with("Content-Length", str(len(BODY))),
        _with("Expect", "100-continue"),
        _with("Upgrade", "h2c"),
    ),
    _one_of(
        _with("Cache-Control", "max-age=0"),
        _with("Pragma", "no-cache"),
        _with("If-None-Match", '"x"'),
        _with("X-Tokenedge-Debug", "1"),
    ),
    _one_of(
        *(_with(n, v) for n, v in (("X-Request-Id", "abc"), ("traceparent", "00-1-2-01"), ("Via", "1.1 e")))
    ),
    _reline,
    _rebyte,
    _relength,
    _one_of(
        *(
            _with(n, v)
            for n, v in (
                ("Bad Name", "x"),
                ("X-Folded", "a\r\n b"),
                ("X-Ctl", "a\x01b"),
                ("X-High", "caf\xe9"),
                ("", "x"),
            )
        )
    ),
    _space,
    _shuffle,
    _drop,
]


def variant(rng: random.Random) -> bytes:
    request = Request()
    for _ in range(rng.randint(1, 3)):
        rng.choice(MUTATIONS)(request, rng)
    return render(request.line, request.fields, request.body, request.sep)


def same_answer(a: bytes, b: bytes) -> bool:
    def plain(body: bytes) -> bytes:
        return re.sub(rb"(chatcmpl-|#|\"created\": ?)\d+", rb"\1N", body)

    return plain(a) == plain(b)


async def answer(gw: RunningGateway, data: bytes) -> tuple[int, bytes, str, str]:
    port = gw.server.port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(30):  # a guard against a hang, not a measurement
            raw = await reader.read(-1)
    finally:
        writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    size = int(headers.get("content-length", "0"))
    status = headers.get("cache-status", "")
    status = ";".join(part for part in status.split(";") if not part.strip().startswith("ttl="))
    return int(lines[0].split(" ", 2)[1]), rest[:size], headers.get("x-cache-key", ""), status


@pytest.mark.parametrize("seed", range(4))
async def test_the_lane_answers_what_the_ordinary_path_answers(
    make_gateway: GatewayFactory, seed: int
) -> None:
    lane = await make_gateway()
    plain = await make_gateway(server={"fast_lane": False})
    good = render("POST /v1/chat/completions HTTP/1.1", BASE_FIELDS, BODY)
    for gw in (lane, plain):
        for _ in range(2):  # stored, then a hit: the lane knows these bytes
            assert (await answer(gw, good))[0] == 200
    before = lane.state.metrics.lane_answers.labels("l1")._value.get()
    rng = random.Random(f"lane-differential-{seed}")
    for n in range(80):
        data = variant(rng)
        ours, theirs = await answer(lane, data), await answer(plain, data)
        # The two gateways share one upstream, whose answers are numbered: the bodies agree but for the number.
        assert ours[0] == theirs[0], (n, data)
        assert ours[2:] == theirs[2:], (n, data)
        assert same_answer(ours[1], theirs[1]), (n, data)
    lane.state.metrics.tally.flush()
    assert (
        lane.state.metrics.lane_answers.labels("l1")._value.get() > before
    )  # the lane answered some variants


@pytest.mark.parametrize(
    "extra",
    [
        b"Connection: Upgrade\r\nUpgrade: h2c\r\n",  # the parser hands the connection over: never the lane's
        b"Upgrade: websocket\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Expect: 100-continue\r\n",
        b"Connection: close\r\n",
        b"Host: second.test\r\n",
        b"Content-Length: 5\r\n",
    ],
)
def test_the_lane_leaves_framing_upgrades_and_odd_hosts_to_the_parser(extra: bytes) -> None:
    good = render("POST /v1/chat/completions HTTP/1.1", BASE_FIELDS, BODY)
    head, _, body = good.partition(b"\r\n\r\n")
    kinds = dict(header_kinds(("authorization",)))
    part = partial(header_part, extra_credentials=frozenset(), extra_transport=frozenset())
    assert plain_head(good, kinds, part) is not None
    assert plain_head(head + b"\r\n" + extra + b"\r\n" + body, kinds, part) is None
