"""`/dashboard` and `/dashboard/data`: access rules, numbers that agree with `/metrics`, and the page in Chromium.

The browser test drives Debian's headless Chromium over the Chrome DevTools Protocol (a websocket, via aiohttp):
no browser download and no extra package. After a scripted mix of hits, misses, bypasses and errors in two 10 s
steps (an injected clock), it asserts that every chart is drawn with data, that the values each chart plots equal
`/dashboard/data`, that those equal `/metrics` scraped at each step, that the console stayed clean, that a
phone-width viewport does not scroll sideways, and saves screenshots to `tests/artifacts/`.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.ops.dashboard.history import RESULTS
from gateway.ops.dashboard.summary import quantile
from harness.gateway import FakeClock, RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.gateway.test_grafana import DASHBOARD
from tests.gateway.test_metrics import Samples, scrape, value

ARTIFACTS = Path(__file__).resolve().parents[2] / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-port=0",
]


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
    looked_up = sum(
        value(m, "tokenedge_requests_total", result=r) for r in ("hit", "miss", "coalesced", "stale")
    )
    assert data["hit_ratio"] == hits / looked_up == 1 / 2  # the bypass is counted apart
    assert data["requests"]["by_result"] == {
        "hit": 1,
        "miss": 1,
        "bypass": 1,
        "coalesced": 0,
        "stale": 0,
        "error": 0,
    }
    assert data["miss_reasons"][0] == {"result": "bypass", "reason": "temperature", "count": 1}
    assert data["tokens_saved"] == 15 and data["tiers"]["l1"]["entries"] == 1
    assert data["latency_s"]["hit"]["p50"] is not None and data["upstream"]["up"] is True


async def test_open_on_loopback_by_default(gw: RunningGateway) -> None:
    page = await gw.client.get("/dashboard")
    assert page.status == 200 and "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "<script" in await page.text() and "http" not in re.sub(
        r"https?://www\.w3\.org", "", await page.text()
    )


async def test_admin_token_required_off_loopback(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"dashboard_public_on_loopback": False, "admin_token": "s3cret"})
    assert (await gw.client.get("/dashboard")).status == 401
    assert (await gw.client.get("/dashboard/data", headers=AUTH_A)).status == 401
    assert (await gw.client.get("/dashboard/data", headers={"Authorization": "Bearer s3cret"})).status == 200
    assert (await gw.client.get("/dashboard?token=s3cret")).status == 200


@pytest.mark.parametrize("proxy_header", ["X-Forwarded-For", "Forwarded", "Via"])
async def test_a_request_relayed_by_a_local_proxy_is_not_local(
    make_gateway: GatewayFactory, proxy_header: str
) -> None:
    gw = await make_gateway(server={"admin_token": "s3cret"})
    relayed = {proxy_header: "for=203.0.113.7" if proxy_header == "Forwarded" else "203.0.113.7"}
    assert (await gw.client.get("/dashboard/data", headers=relayed)).status == 401
    assert (
        await gw.client.get("/dashboard/data", headers={**relayed, "Authorization": "Bearer s3cret"})
    ).status == 200


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
            if (
                method == "Runtime.exceptionThrown"
                or (method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"))
                or (method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error")
            ):
                bad.append(params)
        return bad


@pytest.fixture
async def devtools() -> AsyncIterator[DevTools]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail("chromium is not installed: run `make test` (scripts/install-system.sh installs it)")
    profile = tempfile.mkdtemp(prefix="tokenedge-chromium-")
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        *CHROMIUM_ARGS,
        f"--user-data-dir={profile}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
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


async def wait_rendered(tools: DevTools, window: str = "5m") -> None:
    for _ in range(300):  # until /dashboard/data for `window` has rendered (bounded, ~30 s)
        if await tools.evaluate(f"document.body && document.body.dataset.window === '{window}'"):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the dashboard never rendered its data")


PRICES = {"prices": ["test-model=1000/2000"]}  # USD per million tokens: 10 + 5 tokens per hit cost $0.02


async def mix(gw: RunningGateway, phase: int) -> None:
    """Misses, hits (JSON and streamed), a bypass and an error, each prompt new to this phase."""

    def ask(i: int, **extra: Any) -> dict[str, Any]:
        return {**CHAT, "messages": [{"role": "user", "content": f"phase {phase} question {i}"}], **extra}

    for i in range(3):
        for _ in range(1 + i):  # a miss, then i hits: key 2 is the hottest
            assert (await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)).status == 200
    for _ in range(2):
        resp = await gw.client.post("/v1/chat/completions", json=ask(9, stream=True), headers=AUTH_A)
        assert resp.status == 200 and (await resp.read()).endswith(b"data: [DONE]\n\n")
    assert (
        await gw.client.post("/v1/chat/completions", json=ask(0, temperature=0.7), headers=AUTH_A)
    ).status == 200
    bad = {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}
    assert (await gw.client.post("/v1/chat/completions", json=bad, headers=AUTH_A)).status == 400


def expected_figures(newer: Samples, older: Samples | None = None) -> dict[str, Any]:
    """What `/metrics` says about the interval between two scrapes, computed from the scrapes alone."""

    def inc(name: str, **labels: str) -> float:
        return value(newer, name, **labels) - (value(older, name, **labels) if older else 0.0)

    def buckets(name: str, results: tuple[str, ...]) -> list[tuple[float, float]]:
        bounds = {labels["le"] for labels, _ in newer[name]}
        return [(float(le), sum(inc(name, le=le, result=r) for r in results)) for le in bounds]

    requests = {r: inc("tokenedge_requests_total", result=r) for r in RESULTS}
    lookups = sum(requests[r] for r in ("hit", "miss", "coalesced", "stale"))
    lat = {
        "hit": buckets("tokenedge_request_duration_seconds_bucket", ("hit",)),
        "miss": buckets("tokenedge_request_duration_seconds_bucket", ("miss", "coalesced")),
    }
    ttft = buckets("tokenedge_time_to_first_token_seconds_bucket", ("miss", "coalesced"))
    return {
        "hit_rate": requests["hit"] / lookups if lookups else None,
        "requests": requests,
        "latency_s": {f"{k}_p{q}": quantile(q / 100, lat[k]) for k in ("hit", "miss") for q in (50, 99)},
        "ttft_s": {f"p{q}": quantile(q / 100, ttft) for q in (50, 99)},
        "tokens_saved": inc("tokenedge_tokens_saved_total"),
        "cost_saved_usd": inc("tokenedge_cost_saved_usd_total"),
    }


def interval(series: dict[str, Any], i: int) -> dict[str, Any]:
    return {
        name: ({k: v[i] for k, v in col.items()} if isinstance(col, dict) else col[i])
        for name, col in series.items()
    }


def assert_figures_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() >= want.keys()
    for name, expected in want.items():
        assert got[name] == pytest.approx(expected), name


async def test_window_series_equal_metrics_scraped_at_each_step(
    make_gateway: GatewayFactory, clock: FakeClock
) -> None:
    gw = await make_gateway(dashboard=PRICES)
    await mix(gw, 1)
    first = await scrape(gw)
    clock.advance(10)
    await gw.client.get("/dashboard/data")  # a step is due: recorded
    await mix(gw, 2)
    second = await scrape(gw)
    clock.advance(10)
    data = await (await gw.client.get("/dashboard/data?window=5m")).json()
    window = data["window"]
    assert len(window["t"]) == 2 and window["t"][1] - window["t"][0] == 10
    assert_figures_equal(interval(window["series"], 0), expected_figures(first))
    assert_figures_equal(interval(window["series"], 1), expected_figures(second, first))
    totals = expected_figures(second)
    assert_figures_equal(window["totals"], totals)
    assert totals["requests"] == {"hit": 8, "miss": 8, "coalesced": 0, "stale": 0, "bypass": 2, "error": 2}
    # 6 JSON hits at $0.02 and 2 streamed hits at $0.018: the plain streamed miss was recorded with usage (the
    # gateway asks every stream for it), the stream's 10 + 4 tokens
    assert totals["hit_rate"] == 0.5 and totals["cost_saved_usd"] == pytest.approx(6 * 0.02 + 2 * 0.018)
    assert {"result": "bypass", "reason": "temperature", "count": 2} in window["totals"]["reasons"]
    assert data["hit_ratio"] == 0.5  # since start: the same definition


async def test_windows_and_unknown_window(gw: RunningGateway, clock: FakeClock) -> None:
    for name, step in (("1h", 60), ("24h", 900)):
        window = (await (await gw.client.get(f"/dashboard/data?window={name}")).json())["window"]
        assert window["name"] == name and window["step_s"] == step
    resp = await gw.client.get("/dashboard/data?window=7d")
    assert resp.status == 400 and (await resp.json())["error"]["param"] == "window"


async def test_hot_keys_show_hashes_not_prompts_unless_opted_in(make_gateway: GatewayFactory) -> None:
    for show in (False, True):
        gw = await make_gateway(dashboard={"show_prompts": show})
        for _ in range(3):
            await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
        data = await (await gw.client.get("/dashboard/data")).json()
        (row,) = data["top_keys"]
        assert row["hits"] == 2 and row["model"] == "test-model" and row["key"].split(":")[1] == row["tenant"]
        assert ("What is 2+2?" in str(data)) is show


async def assert_charts_plot(tools: DevTools, series: dict[str, Any]) -> None:
    """Every chart is drawn, plots exactly `series` (from /dashboard/data), and names its lines as the Grafana
    panel of the same title does."""
    charts = await tools.evaluate("""[...document.querySelectorAll('[data-chart]')].map(s => ({
        id: s.dataset.chart, empty: s.dataset.empty === '1', title: s.querySelector('h2').textContent,
        marks: s.querySelectorAll('svg rect, svg path, svg circle').length,
        points: JSON.parse(s.querySelector('svg').dataset.points)}))""")
    plotted = {c["id"]: dict(c["points"]) for c in charts}
    assert all(not c["empty"] and c["marks"] > 0 for c in charts), charts
    assert plotted == {
        "hit_rate": {"hit rate": series["hit_rate"]},
        "requests": series["requests"],
        "latency": {k.replace("_", " "): v for k, v in series["latency_s"].items()},
        "tokens_saved": {"tokens saved": series["tokens_saved"]},
        "cost_saved": {"USD saved": series["cost_saved_usd"]},
        "ttft": series["ttft_s"],
    }
    grafana = {
        panel["title"]: [t["legendFormat"] for t in panel["targets"]]
        for panel in json.loads(DASHBOARD.read_text())["panels"]
    }
    for chart in charts:  # in step with Grafana: the panel of the same title plots the same series
        names, legends = [name for name, _ in chart["points"]], grafana[chart["title"]]
        assert names == legends or (legends == ["{{result}}"] and names == list(RESULTS))


async def test_dashboard_renders_every_chart_from_the_data_in_chromium(
    make_gateway: GatewayFactory, clock: FakeClock, devtools: DevTools
) -> None:
    gw = await make_gateway(dashboard=PRICES)
    await mix(gw, 1)
    clock.advance(10)
    await gw.client.get("/dashboard/data")
    await mix(gw, 2)
    clock.advance(10)
    m = await scrape(gw)

    await devtools.send(
        "Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False
    )
    await devtools.send("Page.navigate", url=f"{gw.url}/dashboard")
    await wait_rendered(devtools)
    data = await (await gw.client.get("/dashboard/data?window=5m")).json()
    window = data["window"]
    assert_figures_equal(window["totals"], expected_figures(m))  # the data equals /metrics

    await assert_charts_plot(devtools, window["series"])
    assert await devtools.evaluate("document.getElementById('hit-rate').textContent") == "50.0%"
    assert await devtools.evaluate("document.getElementById('bypass-error').textContent") == "2 · 2"
    text = await devtools.evaluate("document.body.innerText")
    assert "temperature" in text and "phase 1" not in text  # reasons shown; no prompt text by default
    assert await devtools.evaluate("document.querySelectorAll('#top-keys tbody tr').length") == 6
    assert await devtools.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await screenshot(devtools, "dashboard-desktop.png", width=1280, mobile=False)

    await devtools.send(
        "Emulation.setDeviceMetricsOverride", width=390, height=844, deviceScaleFactor=2, mobile=True
    )
    await devtools.evaluate("window.dispatchEvent(new Event('resize'))")
    assert await devtools.evaluate(
        "document.documentElement.scrollWidth <= window.innerWidth"
    )  # no side scroll
    await screenshot(devtools, "dashboard-phone.png", width=390, mobile=True)
    await devtools.evaluate("document.querySelector('[data-window=\"1h\"]').click()")
    await wait_rendered(devtools, "1h")
    assert devtools.console_errors() == []


async def screenshot(tools: DevTools, name: str, *, width: int, mobile: bool) -> None:
    """The whole page: the viewport is made as tall as the document, so nothing scrolls or is cut."""
    height = await tools.evaluate("document.documentElement.scrollHeight")
    await tools.send(
        "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=mobile
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = await tools.send("Page.captureScreenshot", format="png")
    (ARTIFACTS / name).write_bytes(base64.b64decode(shot["data"]))
