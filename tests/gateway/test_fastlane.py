"""The fast lane (gateway/edge/fastlane.py) and pre-built hits (gateway/hits/render.py) against real HTTP clients, so nothing malformed ever leaves it.

Raw sockets parsed by h11 (pipelined requests in one write, keep-alive, `Connection: close`, HEAD, HTTP/1.0),
the `openai` sync and async clients, curl and wrk. The oracle is the normal path: the same hit served with a
request directive (which sends it the normal way) must carry the same headers, and tally the same metrics.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import orjson
import pytest
from openai import AsyncOpenAI, OpenAI

from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.gateway.test_metrics import scrape, value
from tests.support.fake_upstream import FakeUpstream

RAW = orjson.dumps(CHAT)
OTHER = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "And 3+3?"}]})
TOKEN = AUTH_A["Authorization"].split()[1]
NORMAL = {"Cache-Control": "max-age=3600"}  # a directive: accepted by any fresh hit, but taken the normal way
PATH = "/v1/chat/completions"
HEADERS = {**AUTH_A, "Content-Type": "application/json"}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    names: list[str] = field(default_factory=list)  # header names in order, as sent (duplicates would show)


def request_bytes(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, version: str = "1.1"
) -> bytes:
    auth = [f"{k}: {v}" for k, v in AUTH_A.items()]  # `Accept` as aiohttp's client sends it: key material
    lines = [f"{method} {path} HTTP/{version}", "Host: gateway", "Accept: */*", *auth]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"] if method == "POST" else []
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def exchange(
    gw: RunningGateway, requests: list[tuple[str, str]], payload: bytes
) -> tuple[list[Reply], bool]:
    """Send `payload` (the requests, pipelined) in one write; parse the replies in order with h11.

    `requests` lists each request's (method, target), which h11 needs to frame the replies (HEAD has no body).
    Returns the replies and whether the server then closed the connection.
    """
    reader, writer = await asyncio.open_connection(gw.server.host, gw.server.port)
    writer.write(payload)
    await writer.drain()
    conn, replies = h11.Connection(h11.CLIENT), list[Reply]()
    for method, target in requests:
        if replies:
            conn.start_next_cycle()
        conn.send(h11.Request(method=method, target=target, headers=[("Host", "gateway")]))
        conn.send(h11.EndOfMessage())
        reply: Reply | None = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), 10))
                continue
            if isinstance(event, h11.Response):
                names = [k.decode() for k, _ in event.headers.raw_items()]
                reply = Reply(
                    event.status_code, {k.decode().lower(): v.decode() for k, v in event.headers}, b"", names
                )
            elif isinstance(event, h11.Data):
                assert reply is not None
                reply.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(f"unexpected h11 event {event!r}")
        assert reply is not None
        replies.append(reply)
    closed = (
        (await asyncio.wait_for(reader.read(1), 10)) == b""
        if replies[-1].headers.get("connection")
        else False
    )
    writer.close()
    return replies, closed


async def warm(gw: RunningGateway, *bodies: bytes) -> list[bytes]:
    """A miss that stores, then a hit that warms the memo's key, for each body; returns the stored bodies."""
    out = []
    for body in bodies:
        first = await gw.client.post(PATH, data=body, headers=HEADERS)
        out.append(await first.read())
        await (await gw.client.post(PATH, data=body, headers=HEADERS)).read()
    return out


def without_date(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != "date"}


async def test_fast_hit_carries_exactly_the_normal_paths_headers_and_bytes(gw: RunningGateway) -> None:
    (stored,) = await warm(gw, RAW)
    payload = request_bytes("POST", PATH, RAW) + request_bytes("POST", PATH, RAW, NORMAL)
    (fast, normal), _ = await exchange(gw, [("POST", PATH)] * 2, payload)
    assert fast.status == normal.status == 200
    assert fast.body == normal.body == stored
    assert fast.headers["cache-status"] == "tokenedge; hit; ttl=3600; detail=l1"
    assert without_date(fast.headers) == without_date(normal.headers)
    assert sorted(n.lower() for n in fast.names) == sorted(n.lower() for n in normal.names)  # no duplicates
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", fast.headers["date"])


async def test_pipelined_requests_are_answered_in_order(gw: RunningGateway, fake: FakeUpstream) -> None:
    stored = await warm(gw, RAW, OTHER)
    key = (await gw.client.post(PATH, data=RAW, headers=HEADERS)).headers["X-Cache-Key"]
    miss = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "A new question"}]})
    plan = [
        ("POST", PATH, RAW, None),
        ("POST", PATH, OTHER, None),
        ("POST", PATH, miss, None),
        ("HEAD", f"/v1/cache/{key}", b"", None),
        ("POST", PATH, RAW, NORMAL),
        ("GET", "/health", b"", None),
        ("GET", f"/v1/cache/{key}", b"", None),
        ("POST", PATH, OTHER, None),
    ]
    payload = b"".join(request_bytes(m, t, b, h) for m, t, b, h in plan)
    replies, _ = await exchange(gw, [(m, t) for m, t, _, _ in plan], payload)
    assert [r.status for r in replies] == [200] * len(plan)
    statuses = [r.headers.get("cache-status", "") for r in replies]
    assert (
        statuses[0].endswith("detail=l1") and statuses[1].endswith("detail=l1") and statuses[7].endswith("l1")
    )
    assert statuses[2] == "tokenedge; fwd=miss; stored; detail=exact"
    assert [replies[i].body for i in (0, 1, 4, 6, 7)] == [
        stored[0],
        stored[1],
        stored[0],
        stored[0],
        stored[1],
    ]
    head = replies[3]
    assert head.body == b"" and head.headers["content-length"] == str(len(stored[0]))
    assert head.headers["etag"] == replies[6].headers["etag"]
    assert replies[5].body == b'{"status":"ok"}'


async def test_connection_close_is_honoured_and_announced(gw: RunningGateway) -> None:
    (stored,) = await warm(gw, RAW)
    payload = request_bytes("POST", PATH, RAW, {"Connection": "close"})
    (reply,), closed = await exchange(gw, [("POST", PATH)], payload)
    assert reply.body == stored and reply.headers["connection"] == "close"
    assert reply.headers["cache-status"].endswith("detail=l1")
    assert closed


async def test_http_1_0_gets_a_well_formed_http_1_0_answer(gw: RunningGateway) -> None:
    (stored,) = await warm(gw, RAW)
    reader, writer = await asyncio.open_connection(gw.server.host, gw.server.port)
    writer.write(request_bytes("POST", PATH, RAW, version="1.0"))
    raw = await asyncio.wait_for(reader.read(), 10)  # HTTP/1.0 without keep-alive: read to the close
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK\r\n")
    assert body == stored and b"\r\nContent-Length: %d\r\n" % len(stored) in head
    assert b"detail=l1" in head


async def test_head_on_the_alias_has_headers_and_no_body(gw: RunningGateway) -> None:
    (stored,) = await warm(gw, RAW)
    key = (await gw.client.post(PATH, data=RAW, headers=HEADERS)).headers["X-Cache-Key"]
    plan = [("HEAD", f"/v1/cache/{key}"), ("GET", f"/v1/cache/{key}"), ("HEAD", f"/v1/cache/{key}")]
    payload = b"".join(request_bytes(m, t) for m, t in plan)
    replies, _ = await exchange(gw, plan, payload)
    assert [r.body for r in replies] == [b"", stored, b""]
    assert {r.headers["content-length"] for r in replies} == {str(len(stored))}
    assert without_date(replies[0].headers) == without_date(replies[1].headers)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_openai_clients_read_fast_hits(gw: RunningGateway, kind: str) -> None:
    args: dict[str, Any] = {"model": CHAT["model"], "messages": CHAT["messages"], "temperature": 0}

    def sync() -> list[tuple[str, str]]:
        with OpenAI(base_url=gw.url + "/v1", api_key=TOKEN, max_retries=0) as client:
            raws = [
                client.chat.completions.with_raw_response.create(**args) for _ in range(4)
            ]  # one connection
            return [(r.headers["cache-status"], r.parse().choices[0].message.content or "") for r in raws]

    async def asynchronous() -> list[tuple[str, str]]:
        async with AsyncOpenAI(base_url=gw.url + "/v1", api_key=TOKEN, max_retries=0) as client:
            raws = [await client.chat.completions.with_raw_response.create(**args) for _ in range(4)]
            return [(r.headers["cache-status"], r.parse().choices[0].message.content or "") for r in raws]

    got = await asyncio.to_thread(sync) if kind == "sync" else await asynchronous()
    assert got[0][0] == "tokenedge; fwd=miss; stored; detail=exact"
    assert all(status.endswith("detail=l1") for status, _ in got[1:])
    assert len({text for _, text in got}) == 1 and got[0][1]


async def run(*argv: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def test_curl_reuses_one_connection_for_fast_hits(gw: RunningGateway, tmp_path: Path) -> None:
    (stored,) = await warm(gw, RAW)
    body = tmp_path / "body.json"
    body.write_bytes(RAW)
    one = [
        "-sS",
        "--http1.1",
        "-H",
        "Content-Type: application/json",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "--data-binary",
        f"@{body}",
        "-D",
        "-",
        gw.url + PATH,
    ]
    code, out = await run("curl", "-v", *one, "--next", *one, "--next", *one)
    assert code == 0, out
    # -D - writes each response head at line starts; -v's copies are prefixed with "< ".
    assert len(re.findall(r"^HTTP/1\.1 200 OK\r?$", out, re.M)) == 3
    assert len(re.findall(r"^Cache-Status: tokenedge; hit; ttl=\d+; detail=l1\r?$", out, re.M)) == 3
    assert out.count(stored.decode()) == 3
    assert "Re-using existing connection" in out or "Reusing existing" in out  # keep-alive held across hits


async def test_wrk_with_keep_alive_sees_only_well_formed_hits(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gw = await make_gateway()
    await warm(gw, RAW)
    before = await scrape(gw)
    script = tmp_path / "post.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = [[{RAW.decode()}]]\n'
        f'wrk.headers["Content-Type"] = "application/json"\nwrk.headers["Accept"] = "*/*"\n'
        f'wrk.headers["Authorization"] = "Bearer {TOKEN}"\n'
    )
    code, out = await run("wrk", "-t1", "-c4", "-d1s", "-s", str(script), gw.url + PATH)
    assert code == 0, out
    assert "Socket errors" not in out and "Non-2xx" not in out, out
    done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    after = await scrape(gw)
    hits = value(after, "tokenedge_requests_total", result="hit", reason="l1") - value(
        before, "tokenedge_requests_total", result="hit", reason="l1"
    )
    assert done > 0 and done <= hits <= done + 4  # at most one request per connection in flight at the end


async def drive(gw: RunningGateway, headers: dict[str, str], n: int, tier: str = "l1") -> None:
    for _ in range(n):
        resp = await gw.client.post(PATH, data=RAW, headers={**HEADERS, **headers})
        assert resp.headers["Cache-Status"].endswith(f"detail={tier}")
        await resp.read()


TIMING = re.compile(r"_(sum|bucket|created)$")  # durations and creation times differ; counts must not


# Redis's own size (both gateways share one Redis), read at scrape time: not a tally of the requests driven.
SHARED_GAUGES = ("tokenedge_cache_bytes", "tokenedge_cache_entries")


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[tuple[str, tuple[Any, ...]], float]:
    """Every counter and histogram count that the driven requests changed, and by how much."""
    out = {}
    for name, series in after.items():
        if TIMING.search(name) or name.startswith(SHARED_GAUGES):
            continue
        for labels, v in series:
            if (delta := v - value(before, name, **labels)) != 0:
                out[(name, tuple(sorted(labels.items())))] = delta
    return out


@pytest.mark.parametrize("tier", ["l1", "l2"])
async def test_fast_hits_tally_exactly_what_normal_hits_tally(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest, tier: str
) -> None:
    cache: dict[str, Any] = {}
    if tier == "l2":  # L1 off: every hit is read from Redis, through the fast lane or the normal path
        cache = {"redis_url": request.getfixturevalue("redis_url"), "l1_max_bytes": 0}
    fast_gw = await make_gateway(server={"access_log_sample_rate": 1.0}, cache=cache)
    normal_gw = await make_gateway(server={"access_log_sample_rate": 1.0}, cache=cache)
    tallies, logs = [], []
    for gw, headers in ((fast_gw, {}), (normal_gw, NORMAL)):
        await warm(gw, RAW)
        with caplog.at_level(logging.INFO, logger="tokenedge.access"):
            caplog.clear()
            before = await scrape(gw)
            await drive(gw, headers, 5, tier)
            logs.append(
                [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tokenedge.access"]
            )
        tallies.append(changes(before, await scrape(gw)))
    fast, normal = tallies
    # Which lane answered is its own counter; everything else a hit counts is the same on both lanes.
    lane = ("tokenedge_fast_lane_answers_total", (("tier", tier),))
    assert fast.pop(lane, 0) == 5 and lane not in normal
    assert fast == normal
    hits = (("reason", tier), ("result", "hit"), ("route", "chat/completions"))
    assert fast[("tokenedge_requests_total", hits)] == 5, fast
    assert len(logs[0]) == len(logs[1]) == 5
    for a, b in zip(logs[0], logs[1], strict=True):
        assert {k: v for k, v in a.items() if not k.endswith("_ms")} == {
            k: v for k, v in b.items() if not k.endswith("_ms")
        }
        assert a["result"] == "hit" and a["reason"] == tier and a["status"] == 200
        assert set(a["stages_ms"]) == set(b["stages_ms"]) == {"parse", tier, "serialize"}


async def test_a_known_key_missing_from_l2_is_read_once_then_filled(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    """The fast lane's L2 read that finds nothing is handed to the normal path: one lookup counted, one fill."""
    gw = await make_gateway(
        cache={"redis_url": redis_url, "l1_max_bytes": 0}, server={"admin_token": "admin-secret"}
    )
    await warm(gw, RAW)  # the memo knows the bytes and their key
    key = (await gw.client.post(PATH, data=RAW, headers=HEADERS)).headers["X-Cache-Key"]
    purge = await gw.client.post(
        "/admin/purge", json={"keys": [key]}, headers={"Authorization": "Bearer admin-secret"}
    )
    assert purge.status == 200, await purge.text()
    before, upstream_before = await scrape(gw), sum(fake.calls.values())
    resp = await gw.client.post(PATH, data=RAW, headers=HEADERS)
    assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss; stored")
    await resp.read()
    after = await scrape(gw)
    assert sum(fake.calls.values()) - upstream_before == 1
    lookups = "tokenedge_cache_lookups_total"
    assert (
        value(after, lookups, tier="l2", outcome="miss") - value(before, lookups, tier="l2", outcome="miss")
        == 1
    )
    assert value(after, lookups, tier="l2") - value(before, lookups, tier="l2") == 1
    again = await gw.client.post(PATH, data=RAW, headers=HEADERS)
    assert again.headers["Cache-Status"].endswith("detail=l2")  # stored again, and served fast again


async def test_known_bytes_from_a_refused_or_other_caller_get_the_normal_paths_answer(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    """The lane never answers for a caller it does not know: a refused credential is the normal path's 401 JSON,
    a non-JSON body its 415, another tenant's identical bytes that tenant's own miss (scope isolation)."""
    gw = await make_gateway(server={"refuse_anonymous": True})
    await warm(gw, RAW)  # the memo knows these bytes, keyed for AUTH_A
    anonymous = await gw.client.post(PATH, data=RAW, headers={"Content-Type": "application/json"})
    assert anonymous.status == 401
    assert (await anonymous.json())["error"]["type"] == "authentication_error"
    other_caller = {"Authorization": "Bearer someone-else"}
    octets = await gw.client.post(PATH, data=RAW, headers=other_caller)  # aiohttp declares octet-stream
    assert octets.status == 415  # the normal path's answer to a non-JSON type, known bytes or not
    other = await gw.client.post(PATH, data=RAW, headers={**other_caller, "Content-Type": "application/json"})
    assert other.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 2


async def test_the_lanes_credential_memo_keeps_every_caller_in_its_own_scope(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    """Callers interleaved on known bytes: each is served its own entry; a name's case is the same caller, one more
    credential header another caller (the lane's raw-value scope memo agrees with `Tenancy.scope`)."""
    json_type = {"Content-Type": "application/json"}
    b = {**json_type, "Authorization": "Bearer tenant-b"}
    keys = {}
    for name, headers, status in [
        ("a", HEADERS, "fwd=miss"),
        ("b", b, "fwd=miss"),
        ("a", {**json_type, "authorization": AUTH_A["Authorization"]}, "hit"),
        ("b", b, "hit"),
        ("a2", {**HEADERS, "api-key": "k"}, "fwd=miss"),
        ("a", HEADERS, "hit"),
    ]:
        reply = await gw.client.post(PATH, data=RAW, headers=headers)
        assert reply.headers["Cache-Status"].startswith(f"tokenedge; {status}"), (name, reply.headers)
        assert keys.setdefault(name, reply.headers["X-Cache-Key"]) == reply.headers["X-Cache-Key"]
    assert len(set(keys.values())) == 3 and fake.calls["chat"] == 3
