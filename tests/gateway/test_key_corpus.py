"""The key corpus against the real SmolLM2 backend: at the default level, a shared key means the same answer.

313 committed variants (harness/data/key_corpus.json, harness/key_corpus.py) are explained through a
real gateway (default `auto` level) in front of the real backend app with SmolLM2-135M (GGUF dequantized to fp32,
the reference mode). The oracle for what the model sees is the backend's own tokenizer and chat template; the
oracle for the answer is the backend itself, asked directly (greedy, 24 tokens), all requests at once so the
engine batches them. The model is loaded once for the module (slow, still in the suite).
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from aiohttp.test_utils import TestClient, TestServer

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.loader import load_model
from backend.model.llama import LlamaModel
from backend.server import ServedModel, create_app
from backend.tokenizer import Tokenizer
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from harness.key_corpus import load

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
CORPUS = load()
VARIANTS = [
    (name, group["endpoint"], body) for name, group in CORPUS["groups"].items() for body in group["variants"]
]


class Served:
    def __init__(self, backend: TestClient, gateway: RunningGateway, tokenizer: Tokenizer) -> None:
        self.backend, self.gateway, self.tokenizer = backend, gateway, tokenizer
        self.explained: list[dict[str, Any]] = []


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    loaded = load_model(None, progress=False)
    model = LlamaModel(loaded.config, dtype=torch.float32)
    model.load_weights(loaded.weights)
    config = EngineConfig(
        speculative_tokens=0, num_blocks=1024, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=512
    )
    info = ServedModel(
        id=loaded.name, revision=loaded.revision, tokenizer=loaded.tokenizer, max_model_len=512, created=0
    )
    app = create_app(info, lambda: AsyncEngine(model, config, loaded.tokenizer.eos_token_ids))
    async with TestClient(TestServer(app)) as backend:
        url = str(backend.server.make_url("")).rstrip("/")
        cache_dir: Path = tmp_path_factory.mktemp("tokenizers")
        gateway = await start_gateway(gateway_config(url, tokens={"cache_dir": str(cache_dir)}), FakeClock())
        try:
            yield Served(backend, gateway, loaded.tokenizer)
        finally:
            await gateway.close()


def model_ids(tok: Tokenizer, endpoint: str, body: dict[str, Any]) -> tuple[int, ...]:
    """What the backend feeds the model (backend/server/protocol.py and completions.py), computed by the backend."""
    if endpoint == "completions":
        prompt = body["prompt"][0] if isinstance(body["prompt"], list) else body["prompt"]
        return tuple(tok.encode(prompt))
    messages = [
        {
            **m,
            "content": m["content"]
            if isinstance(m["content"], str)
            else "".join(p["text"] for p in m["content"]),
        }
        for m in body["messages"]
    ]
    return tuple(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))


async def explained(served: Served) -> list[dict[str, Any]]:
    if not served.explained:
        docs = []
        for _, endpoint, body in VARIANTS:
            resp = await served.gateway.client.post(
                "/v1/cache/explain", json={"endpoint": endpoint, "request": body}
            )
            assert resp.status == 200, await resp.text()
            docs.append(await resp.json())
        served.explained = docs
    return served.explained


async def test_the_corpus_is_large_and_grouped() -> None:
    assert len(VARIANTS) >= 200
    kinds = {name.rsplit("-", 1)[0] for name in CORPUS["groups"]}
    assert {
        "chat-ends",
        "chat-inside",
        "chat-crlf",
        "chat-unicode",
        "chat-zero-width",
        "chat-parts",
        "chat-system",
        "chat-order",
        "chat-defaults",
        "chat-tools",
        "prompt-ends",
    } <= kinds


async def test_keys_differ_wherever_the_model_input_ids_differ(served: Served) -> None:
    docs = await explained(served)
    by_key: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    for (_, endpoint, body), doc in zip(VARIANTS, docs, strict=True):
        assert doc["level"] == "tokens"  # the default (`auto`) level with the backend's tokenizer known
        ids = model_ids(served.tokenizer, endpoint, body)
        assert tuple(doc["canonical"]["input"]["ids"]) == ids  # the gateway's ids are the backend's
        by_key[doc["key"]].add(ids)
    assert all(len(ids) == 1 for ids in by_key.values())  # every pair of different ids: different keys
    distinct_ids = {ids for ids_set in by_key.values() for ids in ids_set}
    assert len(by_key) < len(VARIANTS)  # some variants merge
    assert len(distinct_ids) < len(by_key)  # and same ids with other parameters (tools, stop...) stay apart


async def answer(client: TestClient, endpoint: str, body: dict[str, Any]) -> tuple[Any, ...]:
    resp = await client.post(f"/v1/{endpoint}", json=body)
    doc = await resp.json()
    assert resp.status == 200, doc
    choice = doc["choices"][0]
    text = choice["message"]["content"] if endpoint == "chat/completions" else choice["text"]
    return text, choice["finish_reason"], doc["usage"]["completion_tokens"]


async def test_variants_sharing_a_key_get_identical_answers_from_the_model(served: Served) -> None:
    docs = await explained(served)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, doc in enumerate(docs):
        groups[doc["key"]].append(i)
    shared = [members for members in groups.values() if len(members) > 1]
    spelled: dict[
        str, int
    ] = {}  # one model call per distinct request body (groups repeat their base request)
    for i in (i for members in shared for i in members):
        spelled.setdefault(json.dumps([VARIANTS[i][1], VARIANTS[i][2]]), i)
    asked = list(spelled.values())
    # the corpus does merge, at the safe level (14 groups since order inside tools and schemas keys apart)
    assert len(shared) >= 12 and len(asked) >= 100
    answers = await asyncio.gather(*(answer(served.backend, VARIANTS[i][1], VARIANTS[i][2]) for i in asked))
    by_body = dict(zip(spelled, answers, strict=True))
    for members in shared:
        got = {by_body[json.dumps([VARIANTS[i][1], VARIANTS[i][2]])] for i in members}
        assert len(got) == 1, [(VARIANTS[i][0], VARIANTS[i][2]) for i in members]
    assert all(a[2] > 0 for a in answers)


async def test_member_order_merges_only_where_no_upstream_reads_it(served: Served) -> None:
    """Variants equal as JSON values, spelled in another member order: one key where the order is the request's
    fields or a message's keys (`chat-order`), apart where it is inside tools or a schema
    (`chat-tools`), which engines render and generate in order."""
    docs = await explained(served)
    by_group: dict[str, list[tuple[dict[str, Any], str]]] = defaultdict(list)
    for (name, _, body), doc in zip(VARIANTS, docs, strict=True):
        by_group[name].append((body, doc["key"]))
    checked: dict[str, int] = defaultdict(int)
    for name, members in by_group.items():
        for i, (a, key_a) in enumerate(members):
            for b, key_b in members[i + 1 :]:
                if a == b and json.dumps(a) != json.dumps(b):
                    kind = name.rsplit("-", 1)[0]
                    assert (key_a == key_b) == (kind != "chat-tools"), (name, a, b)
                    checked[kind] += 1
    assert checked["chat-tools"] >= 4 and checked["chat-order"] >= 4
