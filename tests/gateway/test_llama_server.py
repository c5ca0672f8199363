"""llama.cpp's own `llama-server` as a real third-party upstream: the gateway in front of it, driven by the real
`openai` client, on the SmolLM2 GGUF served as an org/name alias.

The server is built natively once per machine (harness/peers/llamacpp_build.py; `make llama` does it before the
suite, and the cache makes every later session instant) and started once per session. Where it cannot be built the fixture
errors with the reason: this upstream is part of the suite, not optional. Whether a request reached llama-server is
read from llama-server itself (`llamacpp:tokens_predicted_total` on its `/metrics`), not from the gateway.
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from backend.loader import default_model_path
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from harness.peers.llama_server import LlamaServer, llama_server
from harness.peers.llamacpp_build import ensure_build

ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
GREEDY = {"model": ALIAS, "messages": MESSAGES, "temperature": 0, "max_tokens": 24}
# the first session on a machine may compile llama-server inside this module's first test (`make llama` first)
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="session")
def llama() -> Iterator[LlamaServer]:
    build = ensure_build()  # BuildUnavailable names the reason: an error, never a skip
    # one thread: ggml's threads meet at a spinning barrier per op, so on a busy 2-core machine two of them decoded
    # 10 tok/s here and one 124 tok/s
    with llama_server(build, default_model_path(), alias=ALIAS, slots=1, threads=1, metrics=True) as server:
        yield server


@pytest.fixture
async def gw(llama: LlamaServer, clock: FakeClock) -> AsyncIterator[RunningGateway]:
    revision = f"llama.cpp-{llama.build.version}"  # llama-server reports no revision: the operator sets one
    config = gateway_config(llama.url, upstream={"model_revision": revision, "read_timeout_s": 120.0})
    gateway = await start_gateway(config, clock)
    try:
        yield gateway
    finally:
        await gateway.close()


def predicted(llama: LlamaServer) -> float:
    """Tokens llama-server has generated so far, from its own Prometheus text."""
    with urllib.request.urlopen(f"{llama.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("llamacpp:tokens_predicted_total"))
    return float(line.split()[-1])


def client(gw: RunningGateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url + "/v1", api_key="tenant-a-key", max_retries=0, timeout=120)


async def create(gw: RunningGateway, **args: Any) -> tuple[str, Any]:
    """One JSON completion through the gateway: its Cache-Status and the parsed completion."""
    async with client(gw) as c:
        raw = await c.chat.completions.with_raw_response.create(**{**GREEDY, **args})
        return raw.headers["cache-status"], raw.parse()


async def stream(gw: RunningGateway, **args: Any) -> tuple[str, str, str | None]:
    """One streamed completion through the gateway: its Cache-Status, the text and the finish reason."""
    async with client(gw) as c:
        raw = await c.chat.completions.with_raw_response.create(**{**GREEDY, **args}, stream=True)
        chunks = [chunk async for chunk in raw.parse()]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = next(
        (ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason), None
    )
    return raw.headers["cache-status"], text, finish


async def test_a_miss_then_a_hit_with_identical_content(gw: RunningGateway, llama: LlamaServer) -> None:
    miss_status, miss = await create(gw)
    generated = predicted(llama)
    hit_status, hit = await create(gw)

    assert "fwd=miss" in miss_status and "stored" in miss_status
    assert hit_status.startswith("tokenedge; hit")
    assert predicted(llama) == generated  # the hit never reached llama-server
    assert (
        miss.choices[0].message.content and hit.choices[0].message.content == miss.choices[0].message.content
    )
    assert hit.choices[0].finish_reason == miss.choices[0].finish_reason
    assert hit.model == miss.model == ALIAS


async def test_a_streamed_miss_is_replayed_as_a_streamed_hit(gw: RunningGateway, llama: LlamaServer) -> None:
    miss_status, miss_text, miss_finish = await stream(gw)
    generated = predicted(llama)
    hit_status, hit_text, hit_finish = await stream(gw)

    assert "fwd=miss" in miss_status  # its headers leave before the stream ends: the hit shows it was stored
    assert hit_status.startswith("tokenedge; hit") and predicted(llama) == generated
    assert miss_text and (hit_text, hit_finish) == (miss_text, miss_finish)


async def test_a_json_hit_after_a_plain_stream_carries_llama_servers_usage(
    gw: RunningGateway, llama: LlamaServer
) -> None:
    args = {"messages": [{"role": "user", "content": "What is a lighthouse for?"}]}
    _, streamed_text, _ = await stream(gw, **args)
    generated = predicted(llama)
    hit_status, hit = await create(gw, **args)
    async with AsyncOpenAI(base_url=llama.url + "/v1", api_key="none", max_retries=0, timeout=120) as direct:
        own = await direct.chat.completions.create(**{**GREEDY, **args})

    assert (
        hit_status.startswith("tokenedge; hit")
        and predicted(llama) == generated + own.usage.completion_tokens
    )
    assert hit.choices[0].message.content == streamed_text
    assert (
        hit.usage is not None and hit.usage.prompt_tokens == own.usage.prompt_tokens
    )  # llama-server's count
    assert 0 < hit.usage.completion_tokens <= GREEDY["max_tokens"]
    assert hit.usage.total_tokens == hit.usage.prompt_tokens + hit.usage.completion_tokens


async def test_the_org_name_alias_is_retrieved_through_the_gateway(gw: RunningGateway) -> None:
    async with client(gw) as c:
        raw = await c.models.with_raw_response.retrieve(ALIAS)
        listed = [m.id async for m in c.models.list()]

    assert raw.status_code == 200 and raw.parse().id == ALIAS
    assert ALIAS in listed


async def test_a_seeded_sampled_request_bypasses(gw: RunningGateway, llama: LlamaServer) -> None:
    """llama-server promises no seeded invariance (its /v1/models says nothing of it): each one goes upstream."""
    seeded = {"temperature": 0.8, "seed": 7}
    statuses, counts = [], [predicted(llama)]
    for _ in range(2):
        statuses.append((await create(gw, **seeded))[0])
        counts.append(predicted(llama))

    assert statuses == ["tokenedge; fwd=bypass; detail=seed"] * 2
    assert counts[0] < counts[1] < counts[2]  # llama-server generated both


async def test_keys_are_the_token_ids_llama_server_reports(gw: RunningGateway, llama: LlamaServer) -> None:
    """`auto` keys on the ids llama-server's own /apply-template + /tokenize report, once its probe verified them:
    a request and its one-text-part twin (the same ids) share an entry; a trailing space (other ids) does not."""
    text = "Which planet is the largest?"
    first, _ = await create(gw, messages=[{"role": "user", "content": text}])
    generated = predicted(llama)
    twin, _ = await create(gw, messages=[{"role": "user", "content": [{"type": "text", "text": text}]}])
    after_twin = predicted(llama)
    spaced, _ = await create(gw, messages=[{"role": "user", "content": text + " "}])

    assert "fwd=miss" in first and "detail=tokens" in first, first
    assert (
        twin.startswith("tokenedge; hit") and after_twin == generated
    )  # the twin never reached llama-server
    assert "fwd=miss" in spaced and "detail=tokens" in spaced and predicted(llama) > after_twin
