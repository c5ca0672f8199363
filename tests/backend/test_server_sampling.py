"""Sampling controls over HTTP with the real engine and the tiny random model, through the `openai` client:
logprobs, logit_bias, penalties, min_tokens, ignore_eos, seeded n, prompt lists, echo, /tokenize, /detokenize.

The byte tokenizer makes token id == byte value, so a token's `bytes` name its id."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from tests.backend.test_server_engine import EOS
from tests.backend.tiny_server import openai_client, tiny_server

MESSAGES: Any = [{"role": "user", "content": "Say something."}]


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with tiny_server() as c:
        yield c


@pytest.fixture
def api(client: TestClient) -> openai.AsyncOpenAI:
    return openai_client(client)


async def chat(api: openai.AsyncOpenAI, **extra: Any) -> Any:
    params: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 12}
    return await api.chat.completions.create(**(params | extra))


async def test_chat_logprobs_one_per_token_and_the_greedy_pick_is_the_max(api: openai.AsyncOpenAI) -> None:
    reply = await chat(api, logprobs=True, top_logprobs=5)
    choice = reply.choices[0]
    content = choice.logprobs.content
    ended_by_eos = choice.finish_reason == "stop"
    assert len(content) == reply.usage.completion_tokens - ended_by_eos
    raw = b"".join(bytes(e.bytes) for e in content)
    assert raw.decode("utf-8", errors="replace") == choice.message.content
    for entry in content:
        top = [t.logprob for t in entry.top_logprobs]
        assert len(top) == 5 and top == sorted(top, reverse=True)
        assert entry.top_logprobs[0].bytes == entry.bytes and entry.logprob == top[0] <= 0.0


async def test_completion_logprobs_are_parallel_lists_with_offsets(api: openai.AsyncOpenAI) -> None:
    reply = await api.completions.create(
        model="tiny", prompt="Once upon", temperature=0, max_tokens=10, logprobs=3
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    count = len(lp.tokens)
    assert count == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(count)]
    for chosen, token, top in zip(lp.token_logprobs, lp.tokens, lp.top_logprobs, strict=True):
        assert len(top) <= 3 and max(top.values()) == chosen and top[token] == chosen


async def test_streamed_logprobs_match_the_whole_answer(api: openai.AsyncOpenAI) -> None:
    whole = (await chat(api, logprobs=True, top_logprobs=2)).choices[0].logprobs.content
    stream = await chat(api, logprobs=True, top_logprobs=2, stream=True)
    streamed = [e async for chunk in stream for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    assert [(e.bytes, e.logprob) for e in streamed] == [(e.bytes, e.logprob) for e in whole]


async def test_logit_bias_minus_100_on_the_first_greedy_token_changes_it(api: openai.AsyncOpenAI) -> None:
    first = (await chat(api, logprobs=True)).choices[0].logprobs.content[0].bytes[0]
    biased = await chat(api, logprobs=True, logit_bias={str(first): -100})
    assert biased.choices[0].logprobs.content[0].bytes[0] != first


async def test_frequency_penalty_changes_a_repetitive_answer(api: openai.AsyncOpenAI) -> None:
    plain = (await chat(api, max_tokens=40, extra_body={"ignore_eos": True})).choices[0].message.content
    assert Counter(plain).most_common(1)[0][1] >= 5, plain  # the tiny model repeats itself
    penalized = (
        (await chat(api, max_tokens=40, frequency_penalty=2.0, extra_body={"ignore_eos": True}))
        .choices[0]
        .message.content
    )
    assert penalized != plain
    assert Counter(penalized).most_common(1)[0][1] < Counter(plain).most_common(1)[0][1]


@pytest.mark.parametrize("extra", [{"presence_penalty": 2.0}, {"extra_body": {"repetition_penalty": 1.9}}])
async def test_other_penalties_change_the_answer(api: openai.AsyncOpenAI, extra: dict[str, Any]) -> None:
    body = {"max_tokens": 40, "extra_body": {"ignore_eos": True}}
    plain = (await chat(api, **body)).choices[0].message.content
    kwargs = {**body, **extra, "extra_body": {**body["extra_body"], **extra.get("extra_body", {})}}
    assert (await chat(api, **kwargs)).choices[0].message.content != plain


async def test_min_tokens_holds_back_eos_and_ignore_eos_runs_past_it(api: openai.AsyncOpenAI) -> None:
    eager = {str(EOS): 100}  # EOS first whenever allowed
    assert (await chat(api, logit_bias=eager)).usage.completion_tokens == 1
    held = await chat(api, logit_bias=eager, extra_body={"min_tokens": 3})
    assert held.usage.completion_tokens == 4 and held.choices[0].finish_reason == "stop"
    past = await chat(api, logit_bias=eager, max_tokens=5, extra_body={"ignore_eos": True})
    assert past.usage.completion_tokens == 5 and past.choices[0].finish_reason == "length"


async def test_seeded_n_choices_are_distinct_streams_and_reproducible(api: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {"temperature": 1.0, "seed": 7, "n": 2, "max_tokens": 16}
    first = [c.message.content for c in (await chat(api, **kwargs)).choices]
    again = [c.message.content for c in (await chat(api, **kwargs)).choices]
    assert first == again and first[0] != first[1]


async def test_a_prompt_list_gives_n_choices_per_prompt_in_order(api: openai.AsyncOpenAI) -> None:
    prompts = ["The cat", "A dog", "Rain"]
    alone = [
        (await api.completions.create(model="tiny", prompt=p, temperature=0, max_tokens=8)).choices[0].text
        for p in prompts
    ]
    reply = await api.completions.create(model="tiny", prompt=prompts, temperature=0, max_tokens=8, n=2)
    assert [c.index for c in reply.choices] == list(range(6))
    assert [c.text for c in reply.choices] == [t for t in alone for _ in range(2)]
    assert reply.usage.prompt_tokens == sum(len(p) for p in prompts)


async def test_echo_puts_the_prompt_first(api: openai.AsyncOpenAI) -> None:
    plain = (
        await api.completions.create(model="tiny", prompt="Echo me", temperature=0, max_tokens=6)
    ).choices[0]
    echoed = await api.completions.create(
        model="tiny", prompt="Echo me", temperature=0, max_tokens=6, echo=True
    )
    assert echoed.choices[0].text == "Echo me" + plain.text
    stream = await api.completions.create(
        model="tiny", prompt="Echo me", temperature=0, max_tokens=6, echo=True, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream]) == "Echo me" + plain.text


async def test_tokenize_and_detokenize_round_trip(client: TestClient) -> None:
    resp = await client.post("/tokenize", json={"model": "tiny", "prompt": "héllo"})
    body = await resp.json()
    assert body == {"tokens": list("héllo".encode()), "count": 6, "max_model_len": 512}
    resp = await client.post("/tokenize", json={"messages": MESSAGES})
    assert (await resp.json())["tokens"] == list(b"<user>Say something.\n>")
    resp = await client.post("/detokenize", json={"tokens": body["tokens"]})
    assert await resp.json() == {"prompt": "héllo"}
    for path, bad, param in [
        ("/detokenize", {"tokens": [300]}, "tokens"),
        ("/tokenize", {"prompt": "x", "messages": MESSAGES}, "prompt"),
        ("/tokenize", {"prompt": "x", "truncate": 3}, "truncate"),
    ]:
        resp = await client.post(path, json=bad)
        assert resp.status == 400 and (await resp.json())["error"]["param"] == param


async def test_streamed_completion_logprobs_continue_the_offsets(api: openai.AsyncOpenAI) -> None:
    kwargs: Any = {"model": "tiny", "prompt": "Once upon", "temperature": 0, "max_tokens": 10, "logprobs": 2}
    whole = (await api.completions.create(**kwargs)).choices[0].logprobs
    stream = await api.completions.create(**kwargs, stream=True)
    tokens, offsets, chosen = [], [], []
    async for chunk in stream:
        lp = chunk.choices[0].logprobs
        if lp is not None:
            tokens += lp.tokens
            offsets += lp.text_offset
            chosen += lp.token_logprobs
    assert (tokens, offsets, chosen) == (whole.tokens, whole.text_offset, whole.token_logprobs)
