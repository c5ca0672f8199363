"""Malformed requests: each gets the right 4xx with an OpenAI-style error body, and never reaches the upstream."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import AUTH_A, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

JSON = {"Content-Type": "application/json", **AUTH_A}
GOOD = b'{"model":"test-model","temperature":0,"messages":[{"role":"user","content":"hi"}]}'


def nested(depth: int) -> bytes:
    return (
        b'{"model":"test-model","messages":[{"role":"user","content":"x"}],"x":'
        + b"[" * depth
        + b"]" * depth
        + b"}"
    )


CASES: list[tuple[str, str, bytes, dict[str, str], int, str | None]] = [
    ("bad json", "/v1/chat/completions", b'{"model": ', JSON, 400, None),
    ("empty body", "/v1/chat/completions", b"", JSON, 400, None),
    ("whitespace body", "/v1/chat/completions", b"   \n", JSON, 400, None),
    ("array body", "/v1/chat/completions", b"[1, 2]", JSON, 400, None),
    ("string body", "/v1/chat/completions", b'"hello"', JSON, 400, None),
    (
        "invalid utf-8",
        "/v1/chat/completions",
        b'{"model":"test-model","messages":[{"role":"user","content":"\xff\xfe"}]}',
        JSON,
        400,
        None,
    ),
    ("wrong content type", "/v1/chat/completions", GOOD, {**AUTH_A, "Content-Type": "text/plain"}, 415, None),
    (
        "form content type",
        "/v1/chat/completions",
        b"a=b",
        {**AUTH_A, "Content-Type": "application/x-www-form-urlencoded"},
        415,
        None,
    ),
    ("huge body", "/v1/chat/completions", b'{"model":"' + b"x" * 70_000 + b'"}', JSON, 413, None),
    ("deeply nested", "/v1/chat/completions", nested(200), JSON, 400, None),
    (
        "missing model",
        "/v1/chat/completions",
        b'{"messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "model",
    ),
    (
        "model not a string",
        "/v1/chat/completions",
        b'{"model":5,"messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "model",
    ),
    ("messages not a list", "/v1/chat/completions", b'{"model":"m","messages":"hi"}', JSON, 400, "messages"),
    ("empty messages", "/v1/chat/completions", b'{"model":"m","messages":[]}', JSON, 400, "messages"),
    (
        "message not an object",
        "/v1/chat/completions",
        b'{"model":"m","messages":["hi"]}',
        JSON,
        400,
        "messages[0]",
    ),
    (
        "role missing",
        "/v1/chat/completions",
        b'{"model":"m","messages":[{"content":"hi"}]}',
        JSON,
        400,
        "messages[0].role",
    ),
    (
        "unknown role",
        "/v1/chat/completions",
        b'{"model":"m","temperature":0,"messages":[{"role":"wizard","content":"hi"}]}',
        JSON,
        400,
        "messages[0].role",
    ),
    (
        "null user content",
        "/v1/chat/completions",
        b'{"model":"m","temperature":0,"messages":[{"role":"user","content":null}]}',
        JSON,
        400,
        "messages[0].content",
    ),
    (
        "null system content, streamed",
        "/v1/chat/completions",
        b'{"model":"m","temperature":0,"stream":true,'
        b'"messages":[{"role":"system","content":null},{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "messages[0].content",
    ),
    (
        "missing user content",
        "/v1/chat/completions",
        b'{"model":"m","temperature":0.7,"messages":[{"role":"user"}]}',
        JSON,
        400,
        "messages[0].content",
    ),
    (
        "temperature a string",
        "/v1/chat/completions",
        b'{"model":"m","temperature":"0","messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "temperature",
    ),
    (
        "temperature out of range",
        "/v1/chat/completions",
        b'{"model":"m","temperature":7,"messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "temperature",
    ),
    (
        "n zero",
        "/v1/chat/completions",
        b'{"model":"m","n":0,"messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "n",
    ),
    (
        "max_tokens a float",
        "/v1/chat/completions",
        b'{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "max_tokens",
    ),
    (
        "stream not a bool",
        "/v1/chat/completions",
        b'{"model":"m","stream":"yes","messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "stream",
    ),
    (
        "stop a number",
        "/v1/chat/completions",
        b'{"model":"m","stop":3,"messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        "stop",
    ),
    (
        "NaN temperature",
        "/v1/chat/completions",
        b'{"model":"m","temperature":NaN,"messages":[{"role":"user","content":"hi"}]}',
        JSON,
        400,
        None,
    ),
    ("prompt missing", "/v1/completions", b'{"model":"m"}', JSON, 400, "prompt"),
    ("embedding input an object", "/v1/embeddings", b'{"model":"m","input":{"a":1}}', JSON, 400, "input"),
]


@pytest.mark.parametrize(
    ("name", "path", "raw", "headers", "status", "param"), CASES, ids=[c[0] for c in CASES]
)
async def test_malformed_request_gets_a_json_4xx(
    make_gateway: GatewayFactory,
    fake: FakeUpstream,
    name: str,
    path: str,
    raw: bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    gw = await make_gateway(server={"max_body_bytes": 65536})
    resp = await gw.client.post(path, data=raw, headers=headers)
    body = await resp.json()
    assert resp.status == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param and param in body["error"]["message"]
    assert sum(fake.calls[k] for k in ("chat", "completions", "embeddings")) == 0


async def test_unknown_fields_are_forwarded_and_keyed(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway()
    base = {"model": "test-model", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    a = await gw.client.post("/v1/chat/completions", json={**base, "vendor_knob": 1}, headers=AUTH_A)
    b = await gw.client.post("/v1/chat/completions", json={**base, "vendor_knob": 2}, headers=AUTH_A)
    assert a.status == b.status == 200
    assert a.headers["X-Cache-Key"] != b.headers["X-Cache-Key"]
    assert fake.bodies[0]["vendor_knob"] == 1


async def test_unknown_route_and_method_are_json_errors(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    missing = await gw.client.get("/nope")
    wrong_method = await gw.client.get("/admin/purge")
    assert missing.status == 404
    assert (await missing.json())["error"]["type"] == "not_found_error"
    assert wrong_method.status == 405
    assert wrong_method.headers["Allow"] == "POST"
    assert (await wrong_method.json())["error"]["code"] == "method_not_allowed"


async def test_a_gateway_bug_is_a_json_500_not_a_bare_page(
    make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.intake import pipeline

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(pipeline, "decide", boom)
    gw = await make_gateway()
    resp = await gw.client.post("/v1/chat/completions", data=GOOD, headers=JSON)
    assert resp.status == 500
    assert (await resp.json())["error"]["code"] == "internal_error"


async def test_chunked_body_over_the_limit_is_a_json_413(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(server={"max_body_bytes": 65536})

    async def chunks():  # no Content-Length: the limit must be enforced while reading
        yield b'{"model":"test-model","messages":[{"role":"user","content":"'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}]}'

    resp = await gw.client.post("/v1/chat/completions", data=chunks(), headers=JSON)
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "payload_too_large"
    assert fake.calls["chat"] == 0


async def test_the_gateways_own_errors_are_never_stored_by_an_edge(make_gateway: GatewayFactory) -> None:
    """A 404 for another tenant's alias, a 400, a 404 route: about this request and caller, so no-store for every
    cache in front (RFC 9111 §5.2.2.5; RFC 9213 for the CDN-specific field)."""
    gw = await make_gateway()
    alias = await gw.client.get("/v1/cache/te1:t0123456789abcdef:" + "0" * 64, headers=AUTH_A)
    bad = await gw.client.post(
        "/v1/chat/completions", data=b"{", headers={**AUTH_A, "Content-Type": "application/json"}
    )
    for resp in (alias, bad):
        assert resp.status in (400, 404)
        assert resp.headers["Cache-Control"] == "no-store"
        assert resp.headers["CDN-Cache-Control"] == resp.headers["Surrogate-Control"] == "no-store"
