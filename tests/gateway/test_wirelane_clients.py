"""Real clients through the wire lane (gateway/wirelane.py): the `openai` SDK's sync client (head and body written
apart) and async client, and a `python -m gateway` process on uvloop under wrk and raw keep-alive connections."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.gateway.conftest import AUTH_A, CHAT
from tests.gateway.test_fastpath import PATH, RAW, TOKEN, run, without_date
from tests.gateway.test_metrics import parse as parse_metrics
from tests.gateway.test_metrics import value
from tests.gateway.test_wirelane import Conn, lane
from tests.support.gateway import RunningGateway
from tests.support.workers import gateway_workers


async def test_a_gateway_process_on_uvloop_answers_wrk_and_raw_clients_through_the_wire_lane(
    upstream_url: str, tmp_path: Path
) -> None:
    """`python -m gateway` (uvloop on, as deployed): wrk on keep-alive connections sees only well-formed hits, each
    counted once; raw connections get byte-identical bodies and headers (but `Date`/`Age`) on every repeat."""
    async with gateway_workers(upstream_url, 1) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = await Conn.open((host, int(port)))
        first, *repeats = [await conn.ask() for _ in range(4)]  # miss, fast lane (learns), then the wire lane
        assert first.headers["cache-status"].startswith("tokenedge; fwd=miss; stored")
        for reply in repeats:
            assert reply.body == first.body and reply.headers["cache-status"].endswith("detail=l1")
            assert without_date(reply.headers) == without_date(repeats[0].headers)
        script = tmp_path / "post.lua"
        script.write_text(
            f'wrk.method = "POST"\nwrk.body = [[{RAW.decode()}]]\n'
            f'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "{AUTH_A["Authorization"]}"\n'
        )
        before = parse_metrics(await get_text(url + "/metrics"))
        code, out = await run("wrk", "-t1", "-c8", "-d1s", "-s", str(script), url + PATH)
        after = parse_metrics(await get_text(url + "/metrics"))
        conn.close()
    assert code == 0 and "Socket errors" not in out and "Non-2xx" not in out, out
    done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    counted = {
        name: value(after, name, **labels) - value(before, name, **labels)
        for name, labels in [
            ("tokenedge_requests_total", {"result": "hit", "reason": "l1"}),
            ("tokenedge_wire_lane_answers_total", {"tier": "l1"}),
        ]
    }
    # Every request counted once (at most one per connection still in flight at the end); all but each
    # connection's first (the fast lane serves and learns it) answered on the wire.
    assert done > 100 and done <= counted["tokenedge_requests_total"] <= done + 8
    assert counted["tokenedge_wire_lane_answers_total"] >= done - 8


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.text()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_openai_clients_repeats_are_answered_on_the_wire(gw: RunningGateway, kind: str) -> None:
    """The sync client writes each request's head and body apart, the async one in one write: both are taken whole
    (8 identical requests on one connection: a miss, a fast-lane hit that teaches the lane, then the wire)."""
    args: dict[str, Any] = {"model": CHAT["model"], "messages": CHAT["messages"], "temperature": 0}

    def sync() -> list[str]:
        with OpenAI(base_url=gw.url + "/v1", api_key=TOKEN, max_retries=0) as client:
            raws = [client.chat.completions.with_raw_response.create(**args) for _ in range(8)]
            return [r.parse().choices[0].message.content or "" for r in raws]

    async def asynchronous() -> list[str]:
        async with AsyncOpenAI(base_url=gw.url + "/v1", api_key=TOKEN, max_retries=0) as client:
            raws = [await client.chat.completions.with_raw_response.create(**args) for _ in range(8)]
            return [r.parse().choices[0].message.content or "" for r in raws]

    texts = await asyncio.to_thread(sync) if kind == "sync" else await asynchronous()
    assert len(set(texts)) == 1 and texts[0]
    assert lane(gw).served == 6
