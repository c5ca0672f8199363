"""cdn/varnish/tokenedge.vcl on a real varnishd, in front of the real gateway, in front of the fake upstream.

A serial number in every upstream answer proves where a response came from; `fake.calls` counts what reached the
upstream, and the gateway's own `Cache-Status` member shows whether the gateway was asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from tests.cdn.conftest import AUTH_A, AUTH_B, StackFactory, chat

CHAT = "/v1/chat/completions"
STORED_AT_BOTH = "tokenedge; fwd=miss; stored; detail=exact, varnish; fwd=miss; stored"


async def test_repeated_deterministic_post_is_a_varnish_hit(make_varnish: StackFactory) -> None:
    stack = await make_varnish()

    first, body1 = await stack.post(CHAT, chat())
    second, body2 = await stack.post(CHAT, chat())

    assert first.status == second.status == 200
    assert first.headers["Cache-Status"] == STORED_AT_BOTH
    # The gateway's member is the one stored with the object: the gateway was not asked a second time.
    assert second.headers["Cache-Status"].startswith(
        "tokenedge; fwd=miss; stored; detail=exact, varnish; hit; ttl="
    )
    assert len(second.headers["X-Varnish"].split()) == 2  # this request's id and the stored object's
    assert "Age" in second.headers
    assert body2 == body1
    assert stack.fake.calls["chat"] == 1


async def test_two_tenants_never_share_an_entry(make_varnish: StackFactory) -> None:
    stack = await make_varnish()

    _, answer_a = await stack.post(CHAT, chat(), AUTH_A)
    resp_b, answer_b = await stack.post(CHAT, chat(), AUTH_B)
    again_a, answer_a2 = await stack.post(CHAT, chat(), AUTH_A)
    again_b, answer_b2 = await stack.post(CHAT, chat(), AUTH_B)

    assert resp_b.headers["Cache-Status"] == STORED_AT_BOTH
    assert answer_b != answer_a
    assert (answer_a2, answer_b2) == (answer_a, answer_b)
    assert (
        "varnish; hit" in again_a.headers["Cache-Status"]
        and "varnish; hit" in again_b.headers["Cache-Status"]
    )
    assert stack.fake.calls["chat"] == 2


async def test_anonymous_requests_do_not_share_with_a_tenant(make_varnish: StackFactory) -> None:
    stack = await make_varnish()

    _, answer_a = await stack.post(CHAT, chat(), AUTH_A)
    _, answer_anon = await stack.post(CHAT, chat(), {"X-Nothing": "1"})

    assert answer_anon != answer_a
    assert stack.fake.calls["chat"] == 2


@pytest.mark.parametrize(
    "purge",
    [{"mode": "xkey"}, {"mode": "xkey", "soft": True}, {"mode": "ban"}],
    ids=["xkey", "xkey-soft", "ban"],
)
async def test_admin_purge_by_tag_misses_at_varnish_and_gateway(
    make_varnish: StackFactory, purge: dict[str, object]
) -> None:
    stack = await make_varnish(purge=purge)
    first, _ = await stack.post(CHAT, chat())
    hit, _ = await stack.post(CHAT, chat())
    assert "varnish; hit" in hit.headers["Cache-Status"]
    key = first.headers["X-Cache-Key"]

    result = await stack.admin_purge(tags=[f"key:{key.rsplit(':', 1)[1]}"])
    after, _ = await stack.post(CHAT, chat())

    assert result["purged"]["cdn"]["varnish"]["ok"] is True
    assert after.headers["Cache-Status"] == STORED_AT_BOTH  # a miss at the gateway and at Varnish
    assert stack.fake.calls["chat"] == 2


async def test_purge_is_refused_without_the_configured_token(make_varnish: StackFactory) -> None:
    token = "s3cret-purge-token-0123456789"
    stack = await make_varnish(edge={"purge_token": token})
    await stack.post(CHAT, chat())

    async with stack.http.request(
        "PURGE", stack.url + "/", headers={"xkey-purge": "model:test-model"}
    ) as resp:
        refused = resp.status
    still, _ = await stack.post(CHAT, chat())
    async with stack.http.request(
        "PURGE", stack.url + "/", headers={"xkey-purge": "model:test-model", "X-Purge-Token": token}
    ) as resp:
        accepted = resp.status
    gone, _ = await stack.post(CHAT, chat())

    assert refused == 403
    assert "varnish; hit" in still.headers["Cache-Status"]
    assert accepted == 200
    assert "varnish; fwd=miss" in gone.headers["Cache-Status"]


async def test_nondeterministic_request_is_never_cached_at_the_edge(make_varnish: StackFactory) -> None:
    stack = await make_varnish()
    sampled = chat(temperature=0.7)

    first, body1 = await stack.post(CHAT, sampled)
    second, body2 = await stack.post(CHAT, sampled)

    assert body1 != body2
    assert stack.fake.calls["chat"] == 2
    for resp in (first, second):
        assert resp.headers["Cache-Status"] == "tokenedge; fwd=bypass; detail=temperature, varnish; fwd=miss"
        assert resp.headers["Cache-Control"] == "no-store"


async def test_large_prompts_cache_under_their_full_body(make_varnish: StackFactory) -> None:
    stack = await make_varnish()
    prefix = "lorem ipsum " * 8_600  # ~100 KB, identical but for the last character
    one, two = chat(prefix + "1"), chat(prefix + "2")

    _, answer1 = await stack.post(CHAT, one)
    _, answer2 = await stack.post(CHAT, two)
    hit1, again1 = await stack.post(CHAT, one)
    hit2, again2 = await stack.post(CHAT, two)

    assert answer1 != answer2
    assert (again1, again2) == (answer1, answer2)
    assert "varnish; hit" in hit1.headers["Cache-Status"] and "varnish; hit" in hit2.headers["Cache-Status"]
    assert stack.fake.calls["chat"] == 2


async def test_alias_answers_if_none_match_with_304_through_varnish(make_varnish: StackFactory) -> None:
    stack = await make_varnish()
    stored, _ = await stack.post(CHAT, chat())
    alias = "/v1/cache/" + stored.headers["X-Cache-Key"]

    full, _ = await stack.get(alias)
    again, _ = await stack.get(alias)
    cond, cond_body = await stack.get(alias, {**AUTH_A, "If-None-Match": full.headers["ETag"]})
    other, _ = await stack.get(alias, AUTH_B)

    assert full.status == 200 and full.headers["ETag"] == stored.headers["ETag"]
    assert "varnish; hit" in again.headers["Cache-Status"]
    assert cond.status == 304 and cond_body == b""
    assert other.status == 404  # another tenant's credential never reaches the cached alias


async def test_oversized_body_is_rejected_with_413(make_varnish: StackFactory) -> None:
    stack = await make_varnish(edge={"max_body_bytes": 64 * 1024})

    resp, body = await stack.post(CHAT, chat("x" * 70_000))

    assert resp.status == 413
    assert b"edge_413" in body
    assert stack.fake.calls["chat"] == 0


async def test_oversized_chunked_body_is_rejected(make_varnish: StackFactory) -> None:
    stack = await make_varnish(edge={"max_body_bytes": 64 * 1024})
    port = stack.edge.port
    payload = b'{"model": "test-model", "temperature": 0, "prompt": "' + b"x" * 80_000 + b'"}'
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunked = head + b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n"

    def send() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            with contextlib.suppress(OSError):  # Varnish may close before reading it all
                sock.sendall(chunked)
            try:
                return sock.recv(4096)
            except OSError:
                return b""

    answer = await asyncio.to_thread(send)

    assert answer.startswith(b"HTTP/1.1 413") or answer == b""  # a 413, or a reset: never forwarded
    assert stack.fake.calls["completions"] == 0


async def test_stream_requests_are_not_cached_at_the_edge(make_varnish: StackFactory) -> None:
    stack = await make_varnish()

    first, body1 = await stack.post(CHAT, chat(stream=True))
    second, body2 = await stack.post(CHAT, chat(stream=True))

    # Both went through to the gateway (which may answer the second from its own stream cache).
    for resp in (first, second):
        assert resp.headers["Cache-Status"].endswith(", varnish; fwd=bypass; detail=stream")
        assert len(resp.headers["X-Varnish"].split()) == 1
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Accel-Buffering"] == "no"
    assert b"[DONE]" in body1 and b"[DONE]" in body2


async def test_stream_requests_are_looked_up_when_configured(make_varnish: StackFactory) -> None:
    stack = await make_varnish(edge={"cache_streams": True})

    first, _ = await stack.post(CHAT, chat(stream=True))

    assert "varnish; fwd=" in first.headers["Cache-Status"]
    assert "detail=stream" not in first.headers["Cache-Status"].split(", varnish")[1]


async def test_stale_copy_answers_when_the_gateway_fails(make_varnish: StackFactory) -> None:
    stack = await make_varnish(routes={"chat/completions": {"ttl_s": 1}}, cache={"stale_if_error_s": 300})
    _, answer = await stack.post(CHAT, chat())
    await asyncio.sleep(1.2)  # Varnish counts its TTL in wall-clock seconds
    stack.clock.advance(3_600)  # and the gateway's own copy is long gone
    stack.fake.status = 500

    stale, body = await stack.post(CHAT, chat())

    assert stale.status == 200 and body == answer
    assert "detail=stale-if-error" in stale.headers["Cache-Status"]


@pytest.mark.parametrize("spelling", ["model:my model", "model:my%20model"], ids=["plain", "as-in-header"])
async def test_a_model_name_with_a_space_is_escaped_once_and_purged_at_varnish(
    make_varnish: StackFactory, spelling: str
) -> None:
    stack = await make_varnish()
    direct = await stack.gateway.client.post(CHAT, json=chat(model="my model"), headers=AUTH_A)
    for header in ("Surrogate-Key", "xkey"):
        assert direct.headers[header].split().count("model:my%20model") == 1, direct.headers[header]
    assert "%25" not in direct.headers["Surrogate-Key"] + direct.headers["Cache-Tag"]
    first, _ = await stack.post(CHAT, chat(model="my model"), AUTH_B)
    hit, _ = await stack.post(CHAT, chat(model="my model"), AUTH_B)
    assert first.headers["Cache-Status"] == STORED_AT_BOTH and "varnish; hit" in hit.headers["Cache-Status"]

    result = await stack.admin_purge(tags=[spelling])
    after, _ = await stack.post(CHAT, chat(model="my model"), AUTH_B)

    assert result["purged"]["cdn"]["varnish"]["ok"] is True
    assert after.headers["Cache-Status"] == STORED_AT_BOTH  # a miss at the gateway and at Varnish
