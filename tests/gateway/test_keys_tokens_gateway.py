"""The `tokens` key level through a real gateway in front of the real backend app, whose scripted engine answers
with a checksum of the prompt ids it receives (tests/support/token_backend.py): a different input gives a different
answer, so a wrong hit is visible. The issue's table, explain, the fallback without a token path, and the work a
repeated request skips. The pure key properties: test_keys_tokens.py.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.tokens.encoder import ModelEncoder
from harness.gateway import RunningGateway
from harness.services import serving
from tests.support.token_backend import EchoEngine, backend_app, chatml_byte_tokenizer, oracle_ids

CHAT = "chat/completions"
Make = Callable[..., Awaitable[RunningGateway]]
SERVED = chatml_byte_tokenizer()  # ChatML without trimming, as SmolLM2's template


@pytest.fixture
async def engine() -> EchoEngine:
    return EchoEngine(SERVED)


@pytest.fixture
async def upstream_url(engine: EchoEngine) -> AsyncIterator[str]:
    """The backend app stands where the other gateway tests have the fake upstream (conftest's `make_gateway`)."""
    async with serving(backend_app(SERVED, engine, max_model_len=512)) as url:
        yield url


@pytest.fixture
def make(make_gateway: Make, tmp_path: Path) -> Make:
    async def factory(level: str | None = None, **tokens: Any) -> RunningGateway:
        routes = (
            {r: {"level": level} for r in ("chat/completions", "completions", "embeddings")} if level else {}
        )
        return await make_gateway(tokens={"cache_dir": str(tmp_path), **tokens}, routes=routes)

    return factory


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


TABLE = [  # the issue's table: B differs from A only in bytes the tokenizer sees
    (
        "trailing space",
        "completions",
        {"prompt": "The capital of France is"},
        {"prompt": "The capital of France is "},
    ),
    ("trailing newline", "completions", {"prompt": "def add(a, b):"}, {"prompt": "def add(a, b):\n"}),
    (
        "split content parts",
        CHAT,
        {"messages": [{"role": "user", "content": parts("Name a ", "color.")}]},
        {"messages": [{"role": "user", "content": parts("Name a", "color.")}]},
    ),
]


async def ask(gw: RunningGateway, endpoint: str, body: dict[str, Any]) -> tuple[str, str]:
    resp = await gw.client.post(f"/v1/{endpoint}", json={"model": "tiny", "temperature": 0, **body})
    doc = await resp.json()
    assert resp.status == 200, doc
    choice = doc["choices"][0]
    return resp.headers["Cache-Status"], choice["message"]["content"] if endpoint == CHAT else choice["text"]


@pytest.mark.parametrize(("endpoint", "a", "b"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
async def test_the_issue_table_misses_by_default_and_hits_only_at_the_opt_in_levels(
    make: Make, engine: EchoEngine, endpoint: str, a: dict[str, Any], b: dict[str, Any]
) -> None:
    direct = await make(level="exact")  # B asked on its own: what the model answers to B
    _, b_alone = await ask(direct, endpoint, b)
    engine.prompts.clear()
    default = await make()
    status_a, answer_a = await ask(default, endpoint, a)
    status_b, answer_b = await ask(default, endpoint, b)
    assert status_a == status_b == "tokenedge; fwd=miss; stored; detail=tokens"
    assert len(engine.prompts) == 2 and engine.prompts[0] != engine.prompts[1]  # B went upstream
    assert answer_b == b_alone != answer_a
    for level in ("normalized", "aggressive"):  # opt-in: documented as possibly wrong, and here it is
        engine.prompts.clear()
        opted = await make(level=level)
        assert (await ask(opted, endpoint, a))[0] == f"tokenedge; fwd=miss; stored; detail={level}"
        status, served = await ask(opted, endpoint, b)
        assert status.startswith("tokenedge; hit") and len(engine.prompts) == 1
        assert served == answer_a != b_alone


async def explain(gw: RunningGateway, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await gw.client.post(
        "/v1/cache/explain",
        json={"endpoint": endpoint, "request": {"model": "tiny", "temperature": 0, **body}},
    )
    assert resp.status == 200
    return await resp.json()


async def test_explain_shows_the_level_used_and_keeps_prefills_and_embeddings_inputs_apart(
    make: Make,
) -> None:
    gw = await make()
    prefill = [{"role": "user", "content": "Greet me"}, {"role": "assistant", "content": "Sure, "}]
    a = await explain(gw, CHAT, {"messages": prefill})
    b = await explain(gw, CHAT, {"messages": [prefill[0], {"role": "assistant", "content": "Sure,"}]})
    assert a["level"] == b["level"] == "tokens" and a["route_level"] == "auto"
    assert a["key"] != b["key"]
    assert a["canonical"]["input"]["tokenizer"] == SERVED.version
    assert a["canonical"]["input"]["ids"] == oracle_ids(SERVED, CHAT, {"messages": prefill})
    e1, e2 = (
        await explain(gw, "embeddings", {"input": "hello "}),
        await explain(gw, "embeddings", {"input": "hello"}),
    )
    assert e1["level"] == "tokens" and e1["canonical"]["input"]["ids"] == SERVED.encode("hello ")
    assert e1["key"] != e2["key"]
    exact = await make(level="exact")
    x1, x2 = (
        await explain(exact, "embeddings", {"input": "hello "}),
        await explain(exact, "embeddings", {"input": "hello"}),
    )
    assert x1["level"] == "exact" and x1["canonical"]["input"] == "hello " and x1["key"] != x2["key"]
    real = await gw.client.post(
        "/v1/chat/completions", json={"model": "tiny", "temperature": 0, "messages": prefill}
    )
    assert real.headers["X-Cache-Key"] == a["key"]


async def test_without_the_token_path_auto_and_tokens_fall_back_to_exact(make: Make) -> None:
    for level in (None, "tokens"):
        gw = await make(level=level, enabled=False)
        doc = await explain(gw, "completions", {"prompt": "hi"})
        assert doc["level"] == "exact" and doc["canonical"]["prompt"] == "hi"
        status, _ = await ask(gw, "completions", {"prompt": "hi"})
        assert status == "tokenedge; fwd=miss; stored; detail=exact"


def counting(calls: Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any) -> Any:
        calls[name] += 1
        return fn(*args)

    return counted


async def test_repeated_bytes_hit_without_rendering_or_encoding_and_new_spellings_reuse_the_token_cache(
    make: Make, engine: EchoEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await make()
    body = {"model": "tiny", "temperature": 0, "messages": [{"role": "user", "content": "What is 2+2?"}]}
    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    for _ in range(2):  # a miss that stores, then a hit that warms the request memo
        await gw.client.post("/v1/chat/completions", data=raw, headers=headers)
    calls: Counter[str] = Counter()
    for name in ("encode", "encode_chat", "render_chat"):
        monkeypatch.setattr(ModelEncoder, name, counting(calls, name, getattr(ModelEncoder, name)))
    hit = await gw.client.post("/v1/chat/completions", data=raw, headers=headers)
    assert hit.headers["Cache-Status"].endswith("detail=l1") and calls == Counter()
    assert gw.state.tokens is not None  # built at startup
    cache = gw.state.tokens.cache
    misses = cache.misses
    twin = json.dumps(dict(reversed(list({**body, "temperature": 0.0, "user": "u"}.items())))).encode()
    again = await gw.client.post("/v1/chat/completions", data=twin, headers=headers)
    assert again.headers["Cache-Status"].startswith("tokenedge; hit") and len(engine.prompts) == 1
    assert (
        calls["encode_chat"] == 1 and cache.misses == misses
    )  # rendered once; every segment's ids were cached
