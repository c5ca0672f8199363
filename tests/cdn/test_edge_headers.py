"""End to end: client -> Varnish -> gateway -> fake upstream; every design §5 header reaches the client.

For a miss, a hit and a bypass, in public and tenant scope. The gateway's hit (`tokenedge; hit; ttl=N`) is
seen through Varnish after a Varnish-only purge; its Age (injected clock) carries through Varnish's Age.
"""

from __future__ import annotations

import re

import pytest

from tests.cdn.conftest import StackFactory, chat

CHAT = "/v1/chat/completions"
TTL = 600
EDGE = f"max-age={TTL}, stale-if-error=300"
STRONG_ETAG = re.compile(r'"[^"]+"')
ENTRY_ONLY = (
    "ETag",
    "CDN-Cache-Control",
    "Surrogate-Control",
    "Surrogate-Key",
    "Cache-Tag",
    "xkey",
    "X-Cache-Key",
)


def assert_entry_headers(headers: object, scope: str) -> None:
    h = headers  # multidict
    assert STRONG_ETAG.fullmatch(h["ETag"])  # type: ignore[index]
    expected_cc = f"public, max-age=0, s-maxage={TTL}" if scope == "public" else "private"
    assert h["Cache-Control"] == expected_cc  # type: ignore[index]
    assert h["CDN-Cache-Control"] == h["Surrogate-Control"] == EDGE  # type: ignore[index]
    key = h["X-Cache-Key"]  # type: ignore[index]
    digest = key.rsplit(":", 1)[1]
    tags = {f"key:{digest}", "model:test-model", "rev:rev-1"}
    assert tags <= set(h["Surrogate-Key"].split(" "))  # type: ignore[index]
    assert tags <= set(h["Cache-Tag"].split(","))  # type: ignore[index]
    assert tags <= set(h["xkey"].split(" "))  # type: ignore[index]
    assert key.startswith("te1:pub:" if scope == "public" else "te1:t")


@pytest.mark.parametrize("scope", ["public", "tenant"])
async def test_design_header_matrix_through_varnish(make_varnish: StackFactory, scope: str) -> None:
    stack = await make_varnish(
        routes={"chat/completions": {"scope": scope, "ttl_s": TTL}}, cache={"stale_if_error_s": 300}
    )

    # miss: stored at the gateway and at Varnish
    miss, body = await stack.post(CHAT, chat())
    assert (
        miss.headers["Cache-Status"] == "tokenedge; fwd=miss; stored; detail=exact, varnish; fwd=miss; stored"
    )
    assert miss.headers["Age"] == "0"
    assert_entry_headers(miss.headers, scope)

    # hit at Varnish: the stored object's headers, plus Varnish's hit and Age
    hit, hit_body = await stack.post(CHAT, chat())
    status = hit.headers["Cache-Status"]
    assert status.startswith("tokenedge; fwd=miss; stored; detail=exact, varnish; hit; ttl=")
    assert TTL - 2 <= int(status.rsplit("ttl=", 1)[1]) <= TTL
    assert int(hit.headers["Age"]) >= 0
    assert hit.headers["ETag"] == miss.headers["ETag"] and hit_body == body
    assert_entry_headers(hit.headers, scope)

    # hit at the gateway (Varnish purged directly): the gateway's Age and remaining ttl carry through
    async with stack.http.request(
        "PURGE", stack.url + "/", headers={"xkey-purge": "model:test-model"}
    ) as resp:
        assert resp.status == 200
    stack.clock.advance(5)
    gw_hit, gw_body = await stack.post(CHAT, chat())
    assert gw_hit.headers["Cache-Status"] == (
        f"tokenedge; hit; ttl={TTL - 5}; detail=l1, varnish; fwd=miss; stored"
    )
    assert int(gw_hit.headers["Age"]) >= 5  # RFC 9111 §5.1: the edge adds its residence to the gateway's age
    assert gw_hit.headers["ETag"] == miss.headers["ETag"] and gw_body == body
    assert_entry_headers(gw_hit.headers, scope)

    # bypass: no-store, no Age, no validators, freshness, tags or key
    bypass, _ = await stack.post(CHAT, chat(temperature=0.9))
    assert bypass.headers["Cache-Status"] == "tokenedge; fwd=bypass; detail=temperature, varnish; fwd=miss"
    assert bypass.headers["Cache-Control"] == "no-store"
    assert "Age" not in bypass.headers
    for name in ENTRY_ONLY:
        assert name not in bypass.headers
    assert stack.fake.calls["chat"] == 2


async def test_sse_responses_keep_x_accel_buffering_through_varnish(make_varnish: StackFactory) -> None:
    stack = await make_varnish()

    resp, body = await stack.post(CHAT, chat(stream=True, temperature=0.9))

    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["X-Accel-Buffering"] == "no"
    assert b"[DONE]" in body
