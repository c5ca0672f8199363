"""Passthrough hardening over raw sockets: no traversal spelling reaches the upstream, and the operator's key is
attached only to routes the gateway relays (gateway/handlers/relay.py, gateway/web/paths.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from harness.services import serving
from tests.gateway.conftest import CHAT, GatewayFactory
from tests.support.rawhttp import exchange, request_bytes

OPERATOR_KEY = "sk-operator-secret"


@dataclass
class Capture:
    """An upstream that answers everything and records (method, raw target, Authorization) of each request."""

    seen: list[tuple[str, str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        if (
            request.raw_path == "/tokenedge/revisions"
        ):  # the gateway's own revision watch: no push here, it polls
            return web.json_response({"error": {"message": "not found"}}, status=404)
        self.seen.append((request.method, request.raw_path, request.headers.get("Authorization", "")))
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "test-model", "object": "model"}]})
        if request.path == "/v1/chat/completions":
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "model": "test-model",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hi"},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
        return web.json_response({"object": "list", "data": []})


@pytest.fixture
async def capture() -> AsyncIterator[tuple[Capture, str]]:
    cap = Capture()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", cap.handle)
    async with serving(app) as url:
        yield cap, url


TRAVERSALS = [
    "/v1/../admin/secret",
    "/v1/models/../../x",
    "/v1/./../admin",
    "/v1/chat/completions/../../../admin",
    "/v1/%2e%2e/admin/secret",
    "/v1/%2E%2E/admin",
    "/v1/.%2e/admin",
    "/v1/%2e./admin",
    "/v1/..%2fadmin",
    "/v1/models%2f..%2f..%2fadmin",
    "/v1/%252e%252e/admin",
    "/v1/%25252e%25252e/admin",
    "/v1/%252e%252e%252fadmin",
    "/v1\\..\\admin",
    "/v1/..\\admin",
    "/v1/%5c..%5cadmin",
    "/v1/models%5c..%5c..%5cadmin",
    "/v1/..;/admin",
    "/v1/models;x=1/../../admin",
    "/v1/;/../admin",
    "/v1/models;/..;/..;/admin",
    "//v1/../admin",
    "/v1//../admin",
    "/v1/models//../../../admin",
    "/v1/%c0%ae%c0%ae/admin",
    "http://evil.test/v1/../admin",
    "http://evil.test/v1/%2e%2e/admin",
]


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_no_traversal_spelling_reaches_the_upstream(
    make_gateway: GatewayFactory, capture: tuple[Capture, str], method: str
) -> None:
    cap, url = capture
    gw = await make_gateway(url, upstream={"api_key": OPERATOR_KEY})
    port = gw.server.port
    assert port is not None
    body = orjson.dumps(CHAT) if method == "POST" else b""

    answers = [
        await exchange(port, request_bytes(method, target, {"Content-Type": "application/json"}, body))
        for target in TRAVERSALS
    ]

    assert cap.seen == []  # nothing arrived at all, so nothing outside /v1/ and never the operator's key
    for target, responses in zip(TRAVERSALS, answers, strict=True):
        assert [r.status for r in responses] == [400], target
        assert responses[0].is_openai_error(), target
        assert responses[0].json()["error"]["code"] == "invalid_path"


async def test_escaping_paths_are_named_in_the_error(
    make_gateway: GatewayFactory, capture: tuple[Capture, str]
) -> None:
    gw = await make_gateway(capture[1])
    port = gw.server.port
    assert port is not None
    [escaping] = await exchange(port, request_bytes("GET", "/v1/%2e%2e/admin"))
    [inside] = await exchange(port, request_bytes("GET", "/v1/a%2Fb"))
    assert "leave /v1/" in escaping.json()["error"]["message"]
    assert "leave /v1/" not in inside.json()["error"]["message"]


async def test_only_known_or_listed_routes_are_relayed_and_carry_the_key(
    make_gateway: GatewayFactory, capture: tuple[Capture, str]
) -> None:
    cap, url = capture
    gw = await make_gateway(url, upstream={"api_key": OPERATOR_KEY, "relay_routes": ["vendor/*/jobs"]})
    port = gw.server.port
    assert port is not None
    targets = [
        "/v1/files",
        "/v1/files/file-1?purpose=x",
        "/v1/vendor/acme/jobs",
        "/v1/admin/secret",
        "/v1/vendor/acme/other",
        "/v1/tokenizer",
        "/v1/files/",
        "/admin/secret",
        "/v1",
    ]

    statuses = {t: (await exchange(port, request_bytes("GET", t)))[0] for t in targets}

    assert {t: r.status for t, r in statuses.items()} == {
        "/v1/files": 200,
        "/v1/files/file-1?purpose=x": 200,
        "/v1/vendor/acme/jobs": 200,
        "/v1/admin/secret": 404,
        "/v1/vendor/acme/other": 404,
        "/v1/tokenizer": 404,
        "/v1/files/": 404,
        "/admin/secret": 404,
        "/v1": 404,
    }
    assert all(r.is_openai_error() for r in statuses.values() if r.status >= 400)
    assert [(m, p) for m, p, _ in cap.seen] == [
        ("GET", "/v1/files"),
        ("GET", "/v1/files/file-1?purpose=x"),
        ("GET", "/v1/vendor/acme/jobs"),
    ]
    assert {auth for _, _, auth in cap.seen} == {f"Bearer {OPERATOR_KEY}"}
    assert all(p.startswith("/v1/") for _, p, _ in cap.seen)


async def test_relayed_bodies_still_reach_the_upstream(
    make_gateway: GatewayFactory, capture: tuple[Capture, str]
) -> None:
    cap, url = capture
    gw = await make_gateway(url)
    resp = await gw.client.post("/v1/files", data=b"a body", headers={"Authorization": "Bearer client"})
    assert resp.status == 200
    assert cap.seen == [("POST", "/v1/files", "Bearer client")]


async def test_upstream_failures_name_no_address(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway("http://127.0.0.1:9")  # discard port: connection refused
    resp = await gw.client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer a"})
    text = await resp.text()
    assert resp.status == 502
    assert "127.0.0.1" not in text and ":9" not in text and "Errno" not in text
    assert resp.headers["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("route", ["/files", "../admin", "a/**/b", "a//b", "a;b", "%2e%2e"])
def test_malformed_relay_routes_fail_at_startup(route: str) -> None:
    from gateway.config.settings import ConfigError, GatewayConfig

    with pytest.raises(ConfigError, match="relay_routes"):
        GatewayConfig.from_mapping({"upstream": {"relay_routes": [route]}})
