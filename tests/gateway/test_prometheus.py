"""A real Prometheus (Debian package) scrapes the gateway with the shipped config; PromQL returns the hit ratio.

Prometheus runs as a subprocess on loopback ports; the gateway lives in the test's own loop, so every wait here
is an async poll of an HTTP API (readiness, then "has the scrape landed"), bounded, never a blind sleep.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from harness.gateway import RunningGateway
from harness.services import free_port
from tests.gateway.conftest import AUTH_A, CHAT
from tests.gateway.test_grafana import DASHBOARD, expressions

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "prometheus" / "prometheus.yml"
HIT_RATIO = 'sum(tokenedge_requests_total{result="hit"}) / sum(tokenedge_requests_total)'


def adjusted_config(gateway_port: int, backend_port: int) -> str:
    text = SHIPPED.read_text()
    assert "127.0.0.1:8080" in text and "127.0.0.1:8000" in text and "scrape_interval: 5s" in text
    return (
        text.replace("127.0.0.1:8080", f"127.0.0.1:{gateway_port}")
        .replace("127.0.0.1:8000", f"127.0.0.1:{backend_port}")
        .replace("scrape_interval: 5s", "scrape_interval: 1s")
    )


@pytest.fixture
async def prometheus(gw: RunningGateway) -> AsyncIterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make test` (scripts/install-system.sh installs it)")
    workdir = Path(tempfile.mkdtemp(prefix="tokenedge-prom-"))
    (workdir / "prometheus.yml").write_text(adjusted_config(gw.server.port or 0, free_port()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "prometheus.log").open("w")
    proc = await asyncio.create_subprocess_exec(
        binary,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=log,
        stderr=log,
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):  # readiness, bounded (~30 s)
                try:
                    async with session.get(f"{url}/-/ready") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if proc.returncode is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("prometheus did not become ready")
        if proc.returncode is not None:
            pytest.fail(f"prometheus exited:\n{(workdir / 'prometheus.log').read_text()[-2000:]}")
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


async def query(session: aiohttp.ClientSession, url: str, expr: str) -> dict[str, object]:
    async with session.get(f"{url}/api/v1/query", params={"query": expr}) as resp:
        return json.loads(await resp.text())


async def test_promql_hit_ratio_matches_the_traffic(gw: RunningGateway, prometheus: str) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)  # miss
    for _ in range(3):
        await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)  # hits
    await gw.client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.9}, headers=AUTH_A)  # bypass

    ratio = None
    async with aiohttp.ClientSession() as session:
        for _ in range(
            200
        ):  # until a scrape taken after the traffic has landed (1 s interval; bounded ~20 s)
            answer = await query(session, prometheus, HIT_RATIO)
            result = answer["data"]["result"]  # type: ignore[index]
            if result and float(result[0]["value"][1]) == 3 / 5:
                ratio = 3 / 5
                break
            await asyncio.sleep(0.1)
        assert ratio == 3 / 5
        up = await query(session, prometheus, 'up{job="tokenedge-gateway"}')
        assert float(up["data"]["result"][0]["value"][1]) == 1  # type: ignore[index]


async def test_every_grafana_expression_parses_in_prometheus(gw: RunningGateway, prometheus: str) -> None:
    async with aiohttp.ClientSession() as session:
        for expr in expressions(json.loads(DASHBOARD.read_text())):
            for variable in ("$__rate_interval", "$__interval", "$__range"):  # Grafana's interval variables
                expr = expr.replace(variable, "1m")
            answer = await query(session, prometheus, expr)
            assert answer["status"] == "success", (expr, answer)
