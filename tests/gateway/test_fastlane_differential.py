"""The fast lane answers exactly what the ordinary path answers, for any request bytes (gateway/fastlane.py).

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

import orjson
import pytest

from gateway.fastlane import header_kinds, plain_head
from tests.gateway.conftest import GatewayFactory
from tests.support.gateway import RunningGateway

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


def variant(rng: random.Random) -> bytes:
    line = "POST /v1/chat/completions HTTP/1.1"
    fields = list(BASE_FIELDS)
    body = BODY
    sep = ": "
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(16)
        if kind == 0:
            fields = [(n.upper() if rng.random() < 0.5 else n.lower(), v) for n, v in fields]
        elif kind == 1:
            sep = rng.choice([":", ":  ", ":\t", " : ", ": \t "])
        elif kind == 2:
            fields.append(("Authorization", rng.choice(["Bearer tenant-a-key", "Bearer tenant-b-key", ""])))
        elif kind == 3:
            fields.append(
                (rng.choice(["api-key", "X-Api-Key", "OpenAI-Organization", "OpenAI-Project"]), "k")
            )
        elif kind == 4:
            fields = [
                (
                    n,
                    rng.choice(
                        [
                            "text/plain",
                            "application/json; charset=utf-8",
                            "application/x+json",
                            "APPLICATION/JSON",
                            "multipart/form-data",
                        ]
                    ),
                )
                if n == "Content-Type"
                else (n, v)
                for n, v in fields
            ]
        elif kind == 5:
            fields.append(("Connection", rng.choice(["close", "keep-alive", "keep-alive, close"])))
        elif kind == 6:
            fields.append(
                rng.choice(
                    [
                        ("Transfer-Encoding", "chunked"),
                        ("Content-Length", str(len(body))),
                        ("Expect", "100-continue"),
                        ("Upgrade", "h2c"),
                    ]
                )
            )
        elif kind == 7:
            fields.append(
                rng.choice(
                    [
                        ("Cache-Control", "max-age=0"),
                        ("Pragma", "no-cache"),
                        ("If-None-Match", '"x"'),
                        ("X-Tokenedge-Debug", "1"),
                    ]
                )
            )
        elif kind == 8:
            fields.append(
                rng.choice(
                    [
                        ("X-Request-Id", "abc"),
                        ("traceparent", "00-1-2-01"),
                        ("X-Varnish", "7"),
                        ("CF-Ray", "r"),
                        ("Via", "1.1 edge"),
                    ]
                )
            )
        elif kind == 9:
            line = rng.choice(
                [
                    "POST /v1/chat/completions HTTP/1.0",
                    "post /v1/chat/completions HTTP/1.1",
                    "POST /v1/chat/completions?x=1 HTTP/1.1",
                    "POST //v1/chat/completions HTTP/1.1",
                    "POST /v1/completions HTTP/1.1",
                    "POST /v1/chat/completions/ HTTP/1.1",
                    "POST /V1/chat/completions HTTP/1.1",
                    "PUT /v1/chat/completions HTTP/1.1",
                ]
            )
        elif kind == 10:
            i = rng.randrange(len(body))
            body = body[:i] + bytes([rng.randrange(32, 127)]) + body[i + 1 :]
        elif kind == 11:
            fields = [
                (n, str(int(v) + rng.choice([-1, 1]))) if n == "Content-Length" else (n, v) for n, v in fields
            ]
        elif kind == 12:
            fields.append(
                rng.choice(
                    [
                        ("Bad Name", "x"),
                        ("X-Folded", "a\r\n b"),
                        ("X-Ctl", "a\x01b"),
                        ("X-High", "caf\xe9"),
                        ("", "x"),
                    ]
                )
            )
        elif kind == 13:
            body = body.replace(b"hi there", b"hi there ")
        elif kind == 14:
            rng.shuffle(fields)
        else:
            fields = [
                (n, v)
                for n, v in fields
                if n.lower() != rng.choice(["host", "content-type", "authorization"])
            ]
    return render(line, fields, body, sep)


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
    kinds = header_kinds(("authorization",))
    assert plain_head(good, kinds) is not None
    assert plain_head(head + b"\r\n" + extra + b"\r\n" + body, kinds) is None
