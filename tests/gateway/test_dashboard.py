"""`/dashboard` and `/dashboard/data`: access rules, numbers that agree with `/metrics`, and the page in Chromium.

The browser test drives Debian's headless Chromium over the Chrome DevTools Protocol (a websocket, via aiohttp):
no browser download and no extra package. It asserts the rendered hit rate equals the one `/metrics` implies, that
the console stayed clean, that a phone-width viewport does not scroll sideways, and saves screenshots to
`tests/artifacts/`.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.dashboard.summary import quantile
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.gateway.test_metrics import scrape, value
from tests.support.gateway import RunningGateway

ARTIFACTS = Path(__file__).resolve().parents[2] / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-port=0"]


async def traffic(gw: RunningGateway) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    await gw.client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.7}, headers=AUTH_A)


@pytest.mark.parametrize(("q", "expected"), [(0.5, 1.0), (0.25, 0.5), (1.0, 2.0), (0.99, 1.98)])
def test_quantile_interpolates_like_histogram_quantile(q: float, expected: float) -> None:
    buckets = [(1.0, 2.0), (2.0, 4.0), (float("inf"), 4.0)]
    assert quantile(q, buckets) == pytest.approx(expected)


def test_quantile_without_observations_is_none() -> None:
    assert quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None


async def test_data_agrees_with_metrics(gw: RunningGateway) -> None:
    await traffic(gw)
    data = await (await gw.client.get("/dashboard/data")).json()
    m = await scrape(gw)
    hits = value(m, "tokenedge_requests_total", result="hit")
    looked_up = sum(value(m, "tokenedge_requests_total", result=r) for r in ("hit", "miss", "coalesced", "stale"))
    assert data["hit_ratio"] == hits / looked_up == 1 / 2  # the bypass is counted apart
    assert data["requests"]["by_result"] == {"hit": 1, "miss": 1, "bypass": 1, "coalesced": 0, "stale": 0,
                                             "error": 0}
    assert data["miss_reasons"][0] == {"result": "bypass", "reason": "temperature", "count": 1}
    assert data["tokens_saved"] == 15 and data["tiers"]["l1"]["entries"] == 1
    assert data["latency_s"]["hit"]["p50"] is not None and data["upstream"]["up"] is True


async def test_open_on_loopback_by_default(gw: RunningGateway) -> None:
    page = await gw.client.get("/dashboard")
    assert page.status == 200 and "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "<script" in await page.text() and "http" not in re.sub(r"https?://www\.w3\.org", "", await page.text())


async def test_admin_token_required_off_loopback(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"dashboard_public_on_loopback": False, "admin_token": "s3cret"})
    assert (await gw.client.get("/dashboard")).status == 401
    assert (await gw.client.get("/dashboard/data", headers=AUTH_A)).status == 401
    assert (await gw.client.get("/dashboard/data", headers={"Authorization": "Bearer s3cret"})).status == 200
    assert (await gw.client.get("/dashboard?token=s3cret")).status == 200


@pytest.mark.parametrize("proxy_header", ["X-Forwarded-For", "Forwarded", "Via"])
async def test_a_request_relayed_by_a_local_proxy_is_not_local(make_gateway: GatewayFactory,
                                                               proxy_header: str) -> None:
    gw = await make_gateway(server={"admin_token": "s3cret"})
    relayed = {proxy_header: "for=203.0.113.7" if proxy_header == "Forwarded" else "203.0.113.7"}
    assert (await gw.client.get("/dashboard/data", headers=relayed)).status == 401
    assert (await gw.client.get("/dashboard/data",
                                headers={**relayed, "Authorization": "Bearer s3cret"})).status == 200


async def test_disabled_off_loopback_without_an_admin_token(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"dashboard_public_on_loopback": False})
    assert (await gw.client.get("/dashboard/data")).status == 404


class DevTools:
    """Just enough of the Chrome DevTools Protocol: commands by id, one page session, events collected."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = msg.json()
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        await self.ws.send_json(message)
        reply = await asyncio.wait_for(future, 30)
        assert "error" not in reply, reply
        return reply.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def console_errors(self) -> list[dict[str, Any]]:
        bad = []
        for e in self.events:
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.exceptionThrown" or (method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert")) or (method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error"):
                bad.append(params)
        return bad


@pytest.fixture
async def devtools() -> AsyncIterator[DevTools]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail("chromium is not installed: run `make test` (scripts/install-system.sh installs it)")
    profile = tempfile.mkdtemp(prefix="tokenedge-chromium-")
    proc = await asyncio.create_subprocess_exec(CHROMIUM, *CHROMIUM_ARGS, f"--user-data-dir={profile}",
                                                "about:blank", stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        ws_url = None
        for _ in range(200):  # readiness: Chromium prints its DevTools endpoint on stderr
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            if not line:
                break
            if match := re.search(r"DevTools listening on (ws://\S+)", line):
                ws_url = match.group(1)
                break
        assert ws_url, "chromium did not print its DevTools endpoint"
        drain = asyncio.create_task(proc.stderr.read())  # keep the pipe from filling up
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
            tools = DevTools(ws)
            target = await tools.send("Target.createTarget", url="about:blank")
            attached = await tools.send("Target.attachToTarget", targetId=target["targetId"], flatten=True)
            tools.session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                await tools.send(f"{domain}.enable")
            yield tools
            tools.reader.cancel()
        drain.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


async def wait_rendered(tools: DevTools) -> str:
    for _ in range(300):  # until the first /dashboard/data fetch has rendered (bounded, ~30 s)
        text = await tools.evaluate(
            "document.body && document.body.dataset.ready === '1' ? document.getElementById('hit-rate').textContent : null")
        if text:
            return str(text)
        await asyncio.sleep(0.1)
    raise AssertionError("the dashboard never rendered its data")


async def test_dashboard_renders_the_metrics_hit_rate_in_chromium(gw: RunningGateway, devtools: DevTools) -> None:
    await traffic(gw)
    m = await scrape(gw)
    expected = value(m, "tokenedge_requests_total", result="hit") / value(m, "tokenedge_requests_total")

    await devtools.send("Emulation.setDeviceMetricsOverride", width=390, height=844, deviceScaleFactor=2, mobile=True)
    await devtools.send("Page.navigate", url=f"{gw.url}/dashboard")
    shown = await wait_rendered(devtools)

    assert shown == f"{expected * 100:.1f}%"
    assert await devtools.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # phone: no sideways scroll
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = await devtools.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    (ARTIFACTS / "dashboard-phone.png").write_bytes(base64.b64decode(shot["data"]))
    await devtools.send("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)
    shot = await devtools.send("Page.captureScreenshot", format="png")
    (ARTIFACTS / "dashboard-desktop.png").write_bytes(base64.b64decode(shot["data"]))
    assert devtools.console_errors() == []
