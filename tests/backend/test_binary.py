"""backend/server/binary.py: malformed binary bodies get a 400 (never a crash); good ones stream events."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler

from tests.support.token_backend import EchoEngine, backend_app, chatml_byte_tokenizer
from tokenedge_wire.framing import EVENTS_TYPE, MAGIC, REQUEST_TYPE, FrameReader, encode_request

TOKENIZER = chatml_byte_tokenizer()
PARAMS = {"model": "tiny", "temperature": 0, "max_tokens": 8}


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    engine = EchoEngine(TOKENIZER)
    async with TestClient(TestServer(backend_app(TOKENIZER, engine, max_model_len=32))) as c:
        c.engine = engine  # type: ignore[attr-defined]
        yield c


def good(ids: list[int], **header: object) -> bytes:
    return encode_request(
        {"endpoint": "chat", "tokenizer": TOKENIZER.version, "params": PARAMS, **header}, ids
    )


async def post(client: TestClient, body: bytes, content_type: str = REQUEST_TYPE) -> tuple[int, dict]:
    resp = await client.post("/v1/tokens/generate", data=body, headers={"Content-Type": content_type})
    return resp.status, await resp.json() if resp.content_type == "application/json" else {}


async def test_a_good_body_streams_meta_events_and_usage(client: TestClient) -> None:
    resp = await client.post(
        "/v1/tokens/generate", data=good([104, 105]), headers={"Content-Type": REQUEST_TYPE}
    )
    assert resp.status == 200 and resp.content_type == EVENTS_TYPE
    events = list(FrameReader().feed(await resp.read()))
    assert "meta" in events[0] and "usage" in events[-1]
    assert events[-1]["usage"]["prompt_tokens"] == 2 and events[-2]["f"] == "length"
    assert client.engine.prompts == [[104, 105]]  # type: ignore[attr-defined]


HEAD = b'{"endpoint":"chat","tokenizer":"x","params":{}}'


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"", "magic"),
        (b"XXXX" + struct.pack("<I", 2) + b"{}", "magic"),
        (MAGIC + struct.pack("<I", 100) + b"{}", "truncated header"),
        (MAGIC + struct.pack("<I", 1 << 30) + b"{}", "exceeds"),
        (MAGIC + struct.pack("<I", 3) + b"{x}", "not valid JSON"),
        (MAGIC + struct.pack("<I", 2) + b"[]", "JSON object"),
        (MAGIC + struct.pack("<I", len(HEAD)) + HEAD + b"\x01\x00\x00", "multiple of 4"),
    ],
)
async def test_malformed_framing_is_a_400(client: TestClient, body: bytes, fragment: str) -> None:
    status, doc = await post(client, body)
    assert status == 400 and fragment in doc["error"]["message"]


@pytest.mark.parametrize(
    "ids, fragment",
    [
        ([104, -1], "outside the vocabulary"),
        ([104, TOKENIZER.vocab_size], "outside the vocabulary"),
        ([2**31 - 1], "outside the vocabulary"),
        ([], "empty"),
        ([104] * 40, "maximum context length"),
    ],
)
async def test_bad_ids_are_a_400_and_never_reach_the_engine(
    client: TestClient, ids: list[int], fragment: str
) -> None:
    status, doc = await post(client, good(ids))
    assert status == 400 and fragment in doc["error"]["message"]
    assert client.engine.prompts == []  # type: ignore[attr-defined]


async def test_other_header_problems(client: TestClient) -> None:
    assert (await post(client, good([104], endpoint="embeddings")))[0] == 400
    assert (await post(client, good([104], params=[1])))[0] == 400
    assert (await post(client, good([104], params={**PARAMS, "temperature": 9})))[0] == 400
    status, doc = await post(client, good([104], tokenizer="tok-old"))
    assert status == 409 and doc["error"]["code"] == "tokenizer_mismatch"
    assert (await post(client, good([104]), content_type="application/json"))[0] == 415


async def test_the_backend_advertises_the_binary_transport(client: TestClient) -> None:
    models = await (await client.get("/v1/models")).json()
    assert "binary" in models["data"][0]["tokenedge"]["transports"]


async def test_the_head_the_meta_and_the_first_event_leave_in_one_send() -> None:
    """The gateway wakes once for its first token: the response head is held until the first body write, which
    carries the meta frame and the first event (a head sent at `prepare` would be a send of its own)."""
    sends: list[bytes] = []

    @web.middleware
    async def spy(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        write, writelines = transport.write, transport.writelines
        transport.write = lambda data: (sends.append(bytes(data)), write(data))[1]  # type: ignore[method-assign]
        transport.writelines = lambda parts: (sends.append(b"".join(parts)), writelines(parts))[1]  # type: ignore[method-assign]
        return await handler(request)

    app = backend_app(TOKENIZER, EchoEngine(TOKENIZER), max_model_len=32)
    app.middlewares.append(spy)
    async with TestClient(TestServer(app)) as c:
        resp = await c.post(
            "/v1/tokens/generate",
            data=good([104, 105], params={**PARAMS, "stream": True}),
            headers={"Content-Type": REQUEST_TYPE},
        )
        events = list(FrameReader().feed(await resp.read()))
    assert "meta" in events[0] and events[1]["i"] == 0
    first = sends[0]
    assert first.startswith(b"HTTP/1.1 200") and b'{"meta":' in first and b'{"i":0,' in first
