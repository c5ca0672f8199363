"""A fake OpenAI-compatible model server with a real, bounded prefix cache: a separate process per backend.

It stands in for an engine whose prefill cost depends on what its prefix cache holds (the tokenedge engine's
chained block hash, vLLM, SGLang), so routing tests and `bench scale` can count prefix hits without a model.
Characters are its tokens; the prompt is rendered ChatML-style; whole BLOCK-character blocks are cached by a
chained hash in an LRU of `--capacity` blocks (leaves evicted first), and after each answer the rendered answer is cached too (as an
engine keeps the KV of generated tokens), so the next turn of a conversation can hit all of it. Each request
sleeps `base` plus `--prefill-us` per uncached character (the prefill it would compute), then answers a
deterministic text derived from the prompt. `GET /stats` reports requests, prompt tokens and prefix-hit tokens;
`POST /stats/reset` empties the cache and the counters.

Run: `python -m harness.prefix_backend --port P [--model m --revision r --capacity N --prefill-us U]`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

BLOCK = 16
REVISION_HEADER = "X-Tokenedge-Revision"


def render(messages: list[dict[str, Any]], *, open_assistant: bool = True) -> str:
    text = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if open_assistant else "")


def answer_for(prompt: str, chars: int) -> str:
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()
    words = [f"w{digest[i % 16]}{digest[(i * 7) % 16]}" for i in range(chars // 4 + 1)]
    return " ".join(words)[:chars]


@dataclass
class PrefixCache:
    capacity: int
    blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    @staticmethod
    def chain(text: str) -> list[bytes]:
        out, h = [], b""
        for start in range(0, len(text) - BLOCK + 1, BLOCK):
            h = hashlib.blake2b(h + text[start : start + BLOCK].encode(), digest_size=12).digest()
            out.append(h)
        return out

    def hit_blocks(self, chain: list[bytes]) -> int:
        hits = 0
        for h in chain:
            if h not in self.blocks:
                break
            hits += 1
        return hits

    def insert(self, chain: list[bytes]) -> None:
        """Touch deepest first, so a chain's root is its most recent block: eviction takes leaves first, as the
        engines' radix trees and block evictors do (an evicted root would strand its whole chain)."""
        for h in reversed(chain):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


@dataclass
class PrefixBackend:
    model: str
    revision: str
    cache: PrefixCache
    prefill_s_per_char: float
    base_s: float
    answer_chars: int
    stats: dict[str, int] = field(
        default_factory=lambda: {"requests": 0, "prompt_tokens": 0, "hit_tokens": 0}
    )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/stats", self.get_stats)
        app.router.add_post("/stats/reset", self.reset)
        return app

    async def models(self, request: web.Request) -> web.Response:
        item = {
            "id": self.model,
            "object": "model",
            "owned_by": "fake",
            "tokenedge": {"revision": self.revision},
        }
        return web.json_response({"object": "list", "data": [item]}, headers={REVISION_HEADER: self.revision})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats)

    async def reset(self, request: web.Request) -> web.Response:
        self.cache.blocks.clear()
        self.stats = {k: 0 for k in self.stats}
        return web.json_response(self.stats)

    def _prefill(self, prompt: str) -> tuple[int, float]:
        chain = PrefixCache.chain(prompt)
        hit = self.cache.hit_blocks(chain) * BLOCK
        self.cache.insert(chain)
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += len(prompt)
        self.stats["hit_tokens"] += hit
        return hit, self.base_s + (len(prompt) - hit) * self.prefill_s_per_char

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("model") != self.model:
            error = {"message": f"model {body.get('model')!r} not served", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=404)
        messages = body["messages"]
        prompt = render(messages)
        hit, delay_s = self._prefill(prompt)
        answer = answer_for(prompt, self.answer_chars)
        self.cache.insert(
            PrefixCache.chain(
                render([*messages, {"role": "assistant", "content": answer}], open_assistant=False)
            )
        )
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(answer),
            "total_tokens": len(prompt) + len(answer),
            "prompt_tokens_details": {"cached_tokens": hit},
        }
        await asyncio.sleep(delay_s)  # the prefill this backend would compute
        if body.get("stream"):
            return await self._stream(request, answer, usage)
        return web.json_response(
            {
                "id": f"chatcmpl-{self.stats['requests']}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                ],
                "usage": usage,
            },
            headers={REVISION_HEADER: self.revision},
        )

    async def _stream(self, request: web.Request, answer: str, usage: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", REVISION_HEADER: self.revision}
        )
        await resp.prepare(request)
        base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": self.model}
        pieces = [answer[i : i + 32] for i in range(0, len(answer), 32)]
        for i, piece in enumerate(pieces):
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await asyncio.sleep(self.base_s / 4)  # decode
        last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        await resp.write(b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="m")
    parser.add_argument("--revision", default="r1")
    parser.add_argument("--capacity", type=int, default=4096, help="cached blocks (LRU)")
    parser.add_argument("--prefill-us", type=float, default=10.0, help="per uncached character")
    parser.add_argument("--base-ms", type=float, default=10.0)
    parser.add_argument("--answer-chars", type=int, default=300)
    args = parser.parse_args()
    backend = PrefixBackend(
        args.model,
        args.revision,
        PrefixCache(args.capacity),
        args.prefill_us / 1e6,
        args.base_ms / 1e3,
        args.answer_chars,
    )
    web.run_app(backend.app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
