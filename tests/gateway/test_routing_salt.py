"""Per-tenant engine salts through the gateway (gateway/upstream/routing/salt.py, `upstream.engine_salt`), against a
vLLM-shaped upstream whose prefix cache is keyed by `cache_salt` and which reports `cached_tokens` as vLLM does:
tenant B reuses none of tenant A's prefix, A's own next question reuses it, a client's `cache_salt` is replaced (it
can neither select another tenant's cache nor split the client's own cache key), and a public route shares."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.upstream.routing.salt import engine_salt, salted
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from tests.gateway.conftest import AUTH_A, AUTH_B

SYSTEM = "Clause {}: the licensee shall keep the rainbow clean. "
PREFIX = "".join(SYSTEM.format(i) for i in range(40))
WORDS = len(PREFIX.split())  # 360


class SaltedEngine:
    """A prefix cache per salt: `cached_tokens` is the longest prefix (in words) of an earlier prompt that was sent
    under the same salt (vLLM: blocks are reused only under an equal `cache_salt`)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[list[str]]] = {}
        self.salts: list[str | None] = []

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        salt = body.get("cache_salt")
        self.salts.append(salt)
        words = " ".join(m["content"] for m in body["messages"]).split()
        earlier = self.seen.setdefault(salt or "", [])
        cached = max((_common(words, e) for e in earlier), default=0)
        earlier.append(words)
        usage = {
            "prompt_tokens": len(words),
            "completion_tokens": 1,
            "total_tokens": len(words) + 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response(
            {"object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.fixture
async def engine() -> AsyncIterator[tuple[SaltedEngine, str]]:
    fake = SaltedEngine()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_get("/v1/models", fake.models)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


async def gateway(url: str, **sections: dict[str, Any]) -> RunningGateway:
    upstream = {"engine_salt": True, "model_revision": "r1", **sections.pop("upstream", {})}
    return await start_gateway(gateway_config(url, upstream=upstream, **sections), FakeClock())


async def cached(gw: RunningGateway, auth: dict[str, str], question: str, **extra: Any) -> tuple[int, str]:
    body = {
        "model": "m",
        "temperature": 0,
        "messages": [{"role": "user", "content": PREFIX + question}],
        **extra,
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/chat/completions", json=body, headers=auth) as r,
    ):
        doc = await r.json()
        return doc["usage"]["prompt_tokens_details"]["cached_tokens"], r.headers.get("Cache-Status", "")


async def test_tenants_never_share_a_prefix_and_a_tenant_reuses_its_own(
    engine: tuple[SaltedEngine, str],
) -> None:
    fake, url = engine
    gw = await gateway(url)
    try:
        assert (await cached(gw, AUTH_A, "Question one?"))[0] == 0
        assert (await cached(gw, AUTH_B, "Question two?"))[0] == 0  # B learns nothing of A's prefix
        assert (await cached(gw, AUTH_A, "Question three?"))[0] > WORDS  # A's own next question reuses it
        salt_a = fake.salts[0]
        assert salt_a and fake.salts[1] and salt_a != fake.salts[1] and fake.salts[2] == salt_a
        assert "tenant-a-key" not in salt_a  # derived from the scope by a keyed hash, never the credential
        # B copies A's salt: replaced by B's own, so A's cache stays out of reach (under A's salt this prompt
        # would match A's "Question three?" one word further than B's own "Question two?")
        assert (await cached(gw, AUTH_B, "Question three? Four?", cache_salt=salt_a))[0] == WORDS + 1
        assert fake.salts[-1] == fake.salts[1]  # ...B's salt, not the one B sent
        # and the client's salt does not split B's cache key: the same question with another salt is a hit
        _, status = await cached(gw, AUTH_B, "Question three? Four?", cache_salt="anything")
        assert "hit" in status and len(fake.salts) == 4
    finally:
        await gw.close()


async def test_a_public_route_shares_and_drops_a_client_salt(engine: tuple[SaltedEngine, str]) -> None:
    fake, url = engine
    gw = await gateway(url, routes={"chat/completions": {"scope": "public"}})
    try:
        await cached(gw, AUTH_A, "Public one?", cache_salt="mine")
        assert (await cached(gw, AUTH_B, "Public two?"))[0] >= WORDS
        assert fake.salts == [None, None]
    finally:
        await gw.close()


async def test_off_by_default_the_body_is_the_clients_own(engine: tuple[SaltedEngine, str]) -> None:
    fake, url = engine
    gw = await start_gateway(gateway_config(url, upstream={"model_revision": "r1"}), FakeClock())
    try:
        await cached(gw, AUTH_A, "Plain?", cache_salt="client")
        assert fake.salts == ["client"]
    finally:
        await gw.close()


def test_the_salt_is_keyed_and_the_body_rewrite_is_minimal() -> None:
    assert engine_salt(b"k1", "tabc") != engine_salt(b"k2", "tabc") != engine_salt(b"k1", "tdef")
    raw = b'{"model":"m","cache_salt":"s"}'
    assert salted(raw, {"model": "m", "cache_salt": "s"}, "s")[0] is raw
    assert salted(b'{"model":"m"}', {"model": "m"}, "")[0] == b'{"model":"m"}'
    assert salted(raw, {"model": "m", "cache_salt": "s"}, "")[1] == {"model": "m"}
    assert salted(b"{}", {}, "t")[0] == b'{"cache_salt":"t"}'
