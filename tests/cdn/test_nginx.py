"""cdn/nginx/tokenedge.conf on a real nginx (with njs), in front of the real gateway and the fake upstream.

Checks what cdn/README.md promises for nginx: the alias caches, POST bodies are keyed by an njs hash of the whole
body (never an empty-body collision), tenants stay apart, nothing no-store is kept, no Age header, our hop is
appended to Cache-Status, and exact-key PURGE of alias URLs when ngx_cache_purge is installed.
"""

from __future__ import annotations

import os

import pytest

from cdn.nginx.render import MODULES_DIR, PURGE_MODULE
from tests.cdn.conftest import AUTH_A, AUTH_B, StackFactory, chat

CHAT = "/v1/chat/completions"


async def test_alias_caches_and_serves_hits(make_nginx: StackFactory) -> None:
    stack = await make_nginx()
    stored, _ = await stack.post("/v1/embeddings", {"model": "test-model", "input": "hello"})
    alias = "/v1/cache/" + stored.headers["X-Cache-Key"]

    first, body1 = await stack.get(alias)
    second, body2 = await stack.get(alias)
    other, _ = await stack.get(alias, AUTH_B)

    assert first.status == second.status == 200
    assert first.headers["Cache-Status"].endswith(", nginx; fwd=miss")
    assert second.headers["Cache-Status"].endswith(", nginx; hit")
    assert body2 == body1
    assert other.status == 404  # the cached alias is keyed by the credential too


async def test_public_alias_is_shared_across_credentials(make_nginx: StackFactory) -> None:
    stack = await make_nginx(routes={"chat/completions": {"scope": "public"}})
    stored, _ = await stack.post(CHAT, chat())
    alias = "/v1/cache/" + stored.headers["X-Cache-Key"]

    await stack.get(alias, AUTH_A)
    shared, _ = await stack.get(alias, AUTH_B)

    assert shared.status == 200
    assert shared.headers["Cache-Status"].endswith(", nginx; hit")


async def test_repeated_post_is_an_nginx_hit_without_age(make_nginx: StackFactory) -> None:
    stack = await make_nginx()

    first, body1 = await stack.post(CHAT, chat())
    second, body2 = await stack.post(CHAT, chat())

    assert first.headers["Cache-Status"] == "tokenedge; fwd=miss; stored; detail=exact, nginx; fwd=miss"
    assert second.headers["Cache-Status"] == "tokenedge; fwd=miss; stored; detail=exact, nginx; hit"
    assert body2 == body1
    assert "Age" not in first.headers and "Age" not in second.headers  # nginx sends no Age
    assert stack.fake.calls["chat"] == 1


async def test_two_different_large_prompts_never_share_an_answer(make_nginx: StackFactory) -> None:
    stack = await make_nginx()
    prefix = "lorem ipsum " * 8_600  # ~100 KB: far past the default 8/16 KB in-memory body buffer
    one, two = chat(prefix + "1"), chat(prefix + "2")

    _, answer1 = await stack.post(CHAT, one)
    _, answer2 = await stack.post(CHAT, two)
    hit1, again1 = await stack.post(CHAT, one)
    _, again2 = await stack.post(CHAT, two)

    assert answer1 != answer2
    assert (again1, again2) == (answer1, answer2)
    assert hit1.headers["Cache-Status"].endswith("nginx; hit")
    assert stack.fake.calls["chat"] == 2


async def test_tenants_do_not_share_posts(make_nginx: StackFactory) -> None:
    stack = await make_nginx()

    _, answer_a = await stack.post(CHAT, chat(), AUTH_A)
    _, answer_b = await stack.post(CHAT, chat(), AUTH_B)

    assert answer_a != answer_b
    assert stack.fake.calls["chat"] == 2


async def test_bypassed_requests_are_not_stored(make_nginx: StackFactory) -> None:
    stack = await make_nginx()

    _, body1 = await stack.post(CHAT, chat(temperature=0.7))
    second, body2 = await stack.post(CHAT, chat(temperature=0.7))

    assert body1 != body2
    assert second.headers["Cache-Status"] == "tokenedge; fwd=bypass; detail=temperature, nginx; fwd=miss"
    assert stack.fake.calls["chat"] == 2


async def test_request_no_cache_skips_the_lookup(make_nginx: StackFactory) -> None:
    stack = await make_nginx()
    await stack.post(CHAT, chat())

    resp, _ = await stack.post(CHAT, chat(), {**AUTH_A, "Cache-Control": "no-cache"})

    assert resp.headers["Cache-Status"].endswith("nginx; fwd=bypass")


async def test_oversized_body_is_rejected_with_413(make_nginx: StackFactory) -> None:
    stack = await make_nginx(edge={"max_body_bytes": 64 * 1024})

    resp, _ = await stack.post(CHAT, chat("x" * 70_000))

    assert resp.status == 413
    assert stack.fake.calls["chat"] == 0


@pytest.mark.skipif(
    not os.path.exists(f"{MODULES_DIR}/{PURGE_MODULE}"),
    reason="libnginx-mod-http-cache-purge is not installed",
)
async def test_purge_drops_an_exact_alias_key(make_nginx: StackFactory) -> None:
    stack = await make_nginx()
    stored, _ = await stack.post(CHAT, chat())
    alias = "/v1/cache/" + stored.headers["X-Cache-Key"]
    await stack.get(alias)
    hit, _ = await stack.get(alias)
    assert hit.headers["Cache-Status"].endswith("nginx; hit")

    async with stack.http.get(stack.url + "/tokenedge-purge" + alias, headers=AUTH_A) as resp:
        purged = resp.status
    after, _ = await stack.get(alias)

    assert purged == 200
    assert after.headers["Cache-Status"].endswith("nginx; fwd=miss")
