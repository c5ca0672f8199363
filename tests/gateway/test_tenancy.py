"""Tenant scope (gateway/hits/tenancy.py, gateway/handlers/tenancy.py, gateway/hits/secret.py): every credential part
counts, the key is the deployment's secret, the tenant header is honoured only from trusted proxies, and anonymous callers are documented."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import redis
from aiohttp import web
from multidict import CIMultiDict

from gateway.hits.secret import SECRET_FILE, SECRET_KEY
from harness.services import serving
from tests.gateway.conftest import AUTH_A, AUTH_B, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key", "openai-organization", "openai-project")


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()


CALLERS: list[dict[str, str]] = [
    *({"Authorization": f"Bearer sk-{i}"} for i in range(4)),
    *({"Authorization": basic(f"user{i}")} for i in range(3)),
    {"Authorization": "Token tok-1"},
    {"Authorization": "ApiKey key-1"},
    *({"api-key": f"azure-{i}"} for i in range(3)),
    *({"x-api-key": f"xkey-{i}"} for i in range(3)),
    *({"Authorization": "Bearer shared", "OpenAI-Organization": f"org-{i}"} for i in range(3)),
    *({"Authorization": "Bearer shared", "OpenAI-Project": f"proj-{i}"} for i in range(2)),
    {"Authorization": "Bearer shared"},
    {"api-key": "azure-0", "x-api-key": "xkey-0"},
    {},  # anonymous: one caller to the upstream, so sharing `anon` is right
]


def credential_digest(headers: Any) -> str:
    """What the credential-sensitive upstream puts in its answer: a hash of every credential part it received."""
    received = CIMultiDict(headers)
    parts = sorted((name, received.get(name, "")) for name in CREDENTIAL_HEADERS)
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:24]


async def credential_upstream_chat(request: web.Request) -> web.Response:
    body = await request.json()
    prompt = body["messages"][0]["content"]
    return web.json_response(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {
                        "role": "assistant",
                        "content": f"{credential_digest(request.headers)}|{prompt}",
                    },
                }
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        }
    )


async def credential_upstream_models(_request: web.Request) -> web.Response:
    return web.json_response(
        {"object": "list", "data": [{"id": "test-model", "object": "model", "tokenedge": {"revision": "r1"}}]}
    )


@pytest.fixture
async def credential_upstream() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", credential_upstream_chat)
    app.router.add_get("/v1/models", credential_upstream_models)
    async with serving(app) as url:
        yield url


async def test_no_answer_crosses_callers_under_concurrent_load(
    make_gateway: GatewayFactory, credential_upstream: str
) -> None:
    gw = await make_gateway(credential_upstream, tokens={"enabled": False})
    rng = random.Random(12)
    plan = [(rng.randrange(len(CALLERS)), rng.randrange(8)) for _ in range(5000)]
    limit = asyncio.Semaphore(64)
    wrong: list[tuple[int, str]] = []
    statuses: list[str] = []

    async def one(session: aiohttp.ClientSession, caller: int, prompt: int) -> None:
        body = {**CHAT, "messages": [{"role": "user", "content": f"prompt {prompt}"}]}
        async with (
            limit,
            session.post(gw.url + "/v1/chat/completions", json=body, headers=CALLERS[caller]) as resp,
        ):
            doc = await resp.json()
            statuses.append(resp.headers.get("Cache-Status", ""))
        content = doc["choices"][0]["message"]["content"]
        if content != f"{credential_digest(CALLERS[caller])}|prompt {prompt}":
            wrong.append((caller, content))

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, c, p) for c, p in plan))

    assert len(CALLERS) >= 20 and len(statuses) == 5000
    assert wrong == []
    hits = sum("; hit" in s for s in statuses)
    assert (
        hits >= 5000 - len(CALLERS) * 8 * 2
    )  # the cache was in play: at most one miss (or follower) per pair


async def test_each_credential_part_separates_scopes(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    keys = []
    for caller in CALLERS:
        resp = await gw.client.post("/v1/chat/completions", json=CHAT, headers=caller)
        assert resp.status == 200
        keys.append(resp.headers["X-Cache-Key"].split(":")[1])
    assert len(set(keys)) == len(CALLERS)
    assert keys[-1] == "anon"
    assert all(k.startswith("t") and len(k) == 17 for k in keys[:-1])


async def test_anonymous_callers_can_be_refused(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"refuse_anonymous": True})
    refused = await gw.client.post("/v1/chat/completions", json=CHAT)
    allowed = await gw.client.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": "k"})
    assert refused.status == 401
    assert (await refused.json())["error"]["type"] == "authentication_error"
    assert allowed.status == 200


TENANT = {"tenant_header": "X-Tenant"}


async def test_tenant_header_from_an_untrusted_peer_is_ignored(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(server={**TENANT, "tenant_trusted_cidrs": ["10.0.0.0/8"]})
    first = await gw.client.post("/v1/chat/completions", json=CHAT, headers={**AUTH_A, "X-Tenant": "acme"})
    spoof = await gw.client.post("/v1/chat/completions", json=CHAT, headers={**AUTH_B, "X-Tenant": "acme"})
    same = await gw.client.post("/v1/chat/completions", json=CHAT, headers={**AUTH_A, "X-Tenant": "acme"})
    other = await gw.client.post("/v1/chat/completions", json=CHAT, headers={**AUTH_A, "X-Tenant": "other"})
    bare = await gw.client.post("/v1/chat/completions", json=CHAT)

    assert [first.status, spoof.status, same.status, other.status, bare.status] == [200] * 5
    assert "fwd=miss" in spoof.headers["Cache-Status"]  # the credential decides, not the header
    assert "hit" in same.headers["Cache-Status"]
    # Untrusted, the header is an ordinary one the upstream receives: key material (gateway.keys.parts), so another
    # value is another request, in the same scope.
    assert "fwd=miss" in other.headers["Cache-Status"]
    assert other.headers["X-Cache-Key"].split(":")[1] == same.headers["X-Cache-Key"].split(":")[1]
    assert bare.headers["X-Cache-Key"].startswith("te1:anon:")
    assert fake.calls["chat"] == 4


async def test_trusted_request_without_the_tenant_header_is_refused(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(server={**TENANT, "tenant_trusted_cidrs": ["127.0.0.0/8", "::1/128"]})
    missing = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    first = await gw.client.post("/v1/chat/completions", json=CHAT, headers={**AUTH_A, "X-Tenant": "acme"})
    again = await gw.client.post("/v1/chat/completions", json=CHAT, headers={**AUTH_B, "X-Tenant": "acme"})

    assert missing.status == 401
    assert (await missing.json())["error"]["type"] == "authentication_error"
    assert first.status == again.status == 200
    assert "hit" in again.headers["Cache-Status"]  # the trusted proxy named the tenant
    assert fake.calls["chat"] == 1


async def test_tenant_header_with_the_proxy_secret_is_honoured(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(server={**TENANT, "tenant_proxy_secret": "proxy-s3cret"})
    proxied = {"X-Tokenedge-Proxy-Secret": "proxy-s3cret"}
    first = await gw.client.post(
        "/v1/chat/completions", json=CHAT, headers={**AUTH_A, **proxied, "X-Tenant": "t1"}
    )
    again = await gw.client.post(
        "/v1/chat/completions", json=CHAT, headers={**AUTH_B, **proxied, "X-Tenant": "t1"}
    )
    wrong = await gw.client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={**AUTH_B, "X-Tokenedge-Proxy-Secret": "guess", "X-Tenant": "t1"},
    )
    missing = await gw.client.post("/v1/chat/completions", json=CHAT, headers={**AUTH_A, **proxied})

    assert "hit" in again.headers["Cache-Status"]
    assert "fwd=miss" in wrong.headers["Cache-Status"]  # a wrong secret: the header is ignored
    assert missing.status == 401
    assert first.status == 200
    assert all("x-tokenedge-proxy-secret" not in {k.lower() for k in h} for h in fake.headers)


async def cache_key_of(gw: Any, headers: dict[str, str]) -> str:
    resp = await gw.client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.status == 200
    return str(resp.headers["X-Cache-Key"])


async def test_the_scope_is_keyed_by_the_deployment_secret(make_gateway: GatewayFactory) -> None:
    one = await make_gateway(server={"scope_secret": "secret-1"})
    two = await make_gateway(server={"scope_secret": "secret-1"})
    other = await make_gateway(server={"scope_secret": "secret-2"})
    keys = [await cache_key_of(gw, AUTH_A) for gw in (one, two, other)]
    assert keys[0] == keys[1] != keys[2]
    assert "tenant-a-key" not in keys[0]


async def test_a_created_secret_is_kept_in_the_state_dir(make_gateway: GatewayFactory, tmp_path: Any) -> None:
    state_dir = tmp_path / "state"
    one = await make_gateway(server={"state_dir": str(state_dir)})
    two = await make_gateway(server={"state_dir": str(state_dir)})
    secret_file = state_dir / SECRET_FILE
    assert secret_file.exists() and len(secret_file.read_text().strip()) == 64
    assert oct(os.stat(secret_file).st_mode & 0o777) == "0o600"
    assert await cache_key_of(one, AUTH_A) == await cache_key_of(two, AUTH_A)
    assert [p.name for p in state_dir.iterdir()] == [SECRET_FILE]


async def test_replicas_agree_on_a_secret_created_in_redis(
    make_gateway: GatewayFactory, redis_url: str, tmp_path: Any
) -> None:
    replicas = await asyncio.gather(
        *(
            make_gateway(cache={"redis_url": redis_url}, server={"state_dir": str(tmp_path / f"r{i}")})
            for i in range(3)
        )
    )
    keys = {await cache_key_of(gw, AUTH_A) for gw in replicas}
    assert len(keys) == 1
    assert redis.Redis.from_url(redis_url).get(SECRET_KEY) is not None
    assert not any((tmp_path / f"r{i}").exists() for i in range(3))  # no file when Redis holds it


@pytest.mark.parametrize(
    ("server", "needle"),
    [
        ({"tenant_header": "X-Tenant"}, "tenant_trusted_cidrs"),
        ({"tenant_header": "X-Tenant", "tenant_trusted_cidrs": ["10.0.0.0/33"]}, "not an address or CIDR"),
        ({"header_read_timeout_s": 0}, "header_read_timeout_s"),
        ({"max_connections": 0}, "max_connections"),
    ],
)
def test_unsafe_or_malformed_tenancy_settings_fail_at_startup(server: dict[str, Any], needle: str) -> None:
    from gateway.config.settings import ConfigError, GatewayConfig

    with pytest.raises(ConfigError, match=needle):
        GatewayConfig.from_mapping({"server": server})


def test_the_scope_memo_never_mixes_credential_sets() -> None:
    from gateway.config.settings import ServerConfig
    from gateway.hits.tenancy import MEMO_ENTRIES, Tenancy

    tenancy = Tenancy.from_config(ServerConfig(credential_headers=("X-Team",)), b"secret")
    one = CIMultiDict([("Authorization", "Bearer a"), ("X-Team", "red")])
    two = CIMultiDict([("Authorization", "Bearer a"), ("X-Team", "red"), ("X-Team", "blue")])
    scopes = [tenancy.scope(h, None) for h in (one, two, one, CIMultiDict(one))]
    for i in range(MEMO_ENTRIES + 5):  # past the bound: the memo is cleared, never wrong
        tenancy.scope(CIMultiDict({"x-api-key": f"k{i}"}), None)
    assert scopes[0] != scopes[1] and scopes[0] == scopes[2] == scopes[3]
    assert tenancy.scope(one, None) == scopes[0]
    assert tenancy.scope(CIMultiDict({"x-team": "red"}), None) != tenancy.scope(
        CIMultiDict({"x-team": "blue"}), None
    )
