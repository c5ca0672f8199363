"""Tiny loopback servers the benchmarks compare against: a zero-latency OpenAI-style upstream and a bare aiohttp
app that returns fixed bytes (the floor any aiohttp-based gateway is measured against).

`python -m bench.servers upstream PORT` / `python -m bench.servers bare PORT BODY_FILE`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
from aiohttp import web

MODELS = orjson.dumps(
    {
        "object": "list",
        "data": [{"id": "bench-model", "object": "model", "tokenedge": {"revision": "bench-rev"}}],
    }
)


def completion(n: int) -> bytes:
    return orjson.dumps(
        {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "bench-model",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "The capital of France is Paris. " * 12},
                }
            ],
            "usage": {"prompt_tokens": 24, "completion_tokens": 64, "total_tokens": 88},
        }
    )


def upstream_app() -> web.Application:
    counter = iter(range(1, 1 << 62))

    async def models(_request: web.Request) -> web.Response:
        return web.Response(body=MODELS, content_type="application/json")

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=completion(next(counter)), content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", models)
    return app


def bare_app(body: bytes) -> web.Application:
    async def fixed(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(body=b"{}", content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", fixed)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    app = upstream_app() if kind == "upstream" else bare_app(Path(sys.argv[3]).read_bytes())
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=None, reuse_port="--reuse-port" in sys.argv
    )


if __name__ == "__main__":
    main()
