"""Batch invariance over HTTP: 24 chat requests (12 prompts, with and without a shared system prompt) give the
same text, and the same logprobs where asked, sent one by one, all at once, and in random staggered arrivals,
round after round. Most are greedy; the mix carries logprobs, penalties, logit_bias, a json_object grammar and a
seeded sampled row with a penalty, so per-row processing is checked under load too.

Arrivals are staggered on events, not timers: each request is sent once the previous one has streamed a
random number of chunks, so requests join the running batch at random points of each other's decode.
The tiny random-weight model runs the whole protocol (two rounds) in seconds, but its answers are too
degenerate for a one-ulp difference to show in text; SmolLM2 in bf16 (where the issue saw an answer change under
load) runs it through the real `python -m backend` app, marked slow.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import torch
from aiohttp.test_utils import TestClient, TestServer

from backend.__main__ import build_app
from backend.config import BackendConfig
from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.kernels.load import int4_kernel
from backend.server import ServedModel, create_app
from harness.models.tiny import byte_tokenizer, tiny_model

MAX_TOKENS = 32
SYSTEM = "You are a terse assistant. Answer in one short sentence, plainly, without lists or preambles."
QUESTIONS = [
    "What is the capital of France?",
    "Name a prime number above 50.",
    "Why is the sky blue?",
    "What does a hash table do?",
    "Give one tip for sleeping well.",
    "What is 17 times 3?",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
    "Translate 'good morning' to Spanish.",
    "What is a haiku?",
    "How many legs does a spider have?",
    "What colour is chlorophyll?",
]


TOOLS = [  # small: the tiny model's context is 512 byte tokens, and the tools are shown in a system message
    {
        "type": "function",
        "function": {
            "name": "w",
            "parameters": {
                "type": "object",
                "properties": {"c": {"enum": ["a", "b"]}},
                "required": ["c"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]
# per-request controls, cycled over the requests (greedy unless a temperature is given)
EXTRAS: list[dict[str, Any]] = [
    {},
    {"logprobs": True, "top_logprobs": 3},
    {"frequency_penalty": 1.5},
    {"presence_penalty": 1.0, "logprobs": True},
    {"response_format": {"type": "json_object"}},
    {"logit_bias": {"101": -100, "32": 5}, "repetition_penalty": 1.3},
    {"temperature": 0.8, "seed": 3, "frequency_penalty": 0.5, "logprobs": True, "top_logprobs": 1},
    {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
]
Answer = tuple[str, str]  # the text, and the logprobs it streamed (as JSON)


def requests() -> list[dict[str, Any]]:
    plain = [[{"role": "user", "content": q}] for q in QUESTIONS]
    convos = plain + [[{"role": "system", "content": SYSTEM}, *m] for m in plain]
    return [
        {"messages": m, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": True, **EXTRAS[i % len(EXTRAS)]}
        for i, m in enumerate(convos)
    ]


async def chat(client: TestClient, body: dict[str, Any], started: asyncio.Queue[int] | None) -> Answer:
    """Stream one answer; put each chunk's index on `started` (how far this request has got)."""
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200, await resp.text()
    text, logprobs, chunks = [], [], 0
    async for line in resp.content:
        data = line.decode().strip().removeprefix("data: ")
        if not data or data == "[DONE]" or line.startswith(b":"):
            continue
        choice = json.loads(data)["choices"][0]
        text.append(choice["delta"].get("content") or "")
        text.extend(json.dumps(call["function"]) for call in choice["delta"].get("tool_calls") or ())
        if choice["logprobs"] is not None:
            logprobs.extend(choice["logprobs"]["content"])
        chunks += 1
        if started is not None:
            started.put_nowait(chunks)
    if started is not None:
        started.put_nowait(MAX_TOKENS + 1)  # finished: never leave the launcher waiting
    assert bool(logprobs) == bool(body.get("logprobs")), body
    return "".join(text), json.dumps(logprobs)


async def staggered(client: TestClient, batch: list[dict[str, Any]], rng: random.Random) -> list[Answer]:
    """Send in a random order; each next request waits until the last one has streamed 0-6 chunks."""
    order = list(range(len(batch)))
    rng.shuffle(order)
    tasks: dict[int, asyncio.Task[Answer]] = {}
    for index in order:
        progress: asyncio.Queue[int] = asyncio.Queue()
        tasks[index] = asyncio.create_task(chat(client, batch[index], progress))
        wanted = rng.randint(0, 6)
        while wanted and await progress.get() < wanted:
            pass
    return [await tasks[i] for i in range(len(batch))]


async def check_protocol(client: TestClient, rounds: int = 2) -> list[int]:
    """Assert every text is the same alone, together and staggered; return the requests whose logprobs were
    not (the caller asserts that list: logprobs see differences in the last bits that greedy text hides)."""
    batch = requests()
    alone = [await chat(client, body, None) for body in batch]
    assert len({text for text, _ in alone}) >= 6, alone  # the prompts lead to different answers
    rng = random.Random(14)
    logprobs_differ: set[int] = set()
    for _ in range(rounds):
        for answers in (
            await asyncio.gather(*(chat(client, body, None) for body in batch)),
            await staggered(client, batch, rng),
        ):
            assert [i for i, (text, _) in enumerate(answers) if text != alone[i][0]] == []
            logprobs_differ |= {i for i, (_, lp) in enumerate(answers) if lp != alone[i][1]}
    return sorted(logprobs_differ)


@pytest.fixture
async def tiny_client() -> AsyncIterator[TestClient]:
    model = tiny_model(seed=4, dtype=torch.bfloat16)
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}>"
    config = EngineConfig(
        speculative_tokens=0, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=96, max_model_len=512
    )
    served = ServedModel(
        id="tiny",
        revision="rev-tiny",
        tokenizer=byte_tokenizer(template, eos=0),
        max_model_len=512,
        created=0,
    )
    app = create_app(served, lambda: AsyncEngine(model, config, frozenset({0})))
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_tiny_model_answers_the_same_alone_together_and_staggered(tiny_client: TestClient) -> None:
    entry = (await (await tiny_client.get("/v1/models")).json())["data"][0]
    assert entry["tokenedge"]["batch_invariant"] is True
    assert await check_protocol(tiny_client) == []


async def test_tiny_model_seeded_sampling_is_the_same_alone_and_together(tiny_client: TestClient) -> None:
    """What `tokenedge.seeded_invariant` promises the gateway: a seeded sampled answer whatever else is batched."""
    entry = (await (await tiny_client.get("/v1/models")).json())["data"][0]
    assert entry["tokenedge"]["seeded_invariant"] is True
    batch = [
        {**body, "temperature": 1.0, "top_p": 0.95, "seed": 100 + i} for i, body in enumerate(requests()[:8])
    ]
    alone = [await chat(tiny_client, body, None) for body in batch]
    together = await asyncio.gather(*(chat(tiny_client, body, None) for body in batch))
    reseeded = await chat(tiny_client, {**batch[0], "seed": 7}, None)

    assert together == alone
    assert reseeded != alone[0]  # the seed is what pins the draw


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def smollm2_client() -> AsyncIterator[TestClient]:
    config = BackendConfig(
        dtype="bfloat16", engine=EngineConfig(num_blocks=512, max_num_seqs=16, max_model_len=1024)
    )
    async with TestClient(TestServer(build_app(config))) as client:
        yield client


@pytest.mark.slow
@pytest.mark.timeout(900)  # about a minute on an idle 2-core machine; the CI machine is shared
@pytest.mark.asyncio(loop_scope="module")
async def test_smollm2_bf16_answers_the_same_alone_together_and_staggered(smollm2_client: TestClient) -> None:
    entry = (await (await smollm2_client.get("/v1/models")).json())["data"][0]
    assert entry["tokenedge"]["batch_invariant"] is True
    logprobs_differ = await check_protocol(smollm2_client)  # the texts were asserted equal
    if logprobs_differ and int4_kernel() == "torch":
        # Known, outside the server: on CPUs without AMX (torch's int4/int8 kernels) the quantized model's hidden
        # states differ in their last bits once a decode step has 4 rows (dequantized weights stay bitwise
        # equal); greedy text hides it, logprobs show it. Kept visible as an xfail until the kernels are fixed.
        pytest.xfail(f"logprobs of requests {logprobs_differ} changed under load with torch's int4 kernel")
    assert logprobs_differ == []
