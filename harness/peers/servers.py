"""Tiny loopback servers the benchmarks compare against: a zero-latency OpenAI-style upstream and a bare aiohttp
app that returns fixed bytes (the floor any aiohttp-based gateway is measured against).

`python -m harness.peers.servers upstream PORT` / `python -m harness.peers.servers bare PORT BODY_FILE` /
`python -m harness.peers.servers sink PORT` (an OTLP/HTTP trace collector that keeps nothing).
"""

from __future__ import annotations

import multiprocessing
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


def sink_app() -> web.Application:
    """An OTLP/HTTP trace collector that keeps nothing: every export answered with an empty success."""

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(body=b"{}", content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/health", health)
    return app


def serve(kind: str, port: int, body_file: str, reuse_port: bool) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    apps = {"upstream": upstream_app, "sink": sink_app}
    app = apps[kind]() if kind in apps else bare_app(Path(body_file).read_bytes())
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, reuse_port=reuse_port)


def main() -> None:
    """`bare PORT BODY_FILE [--workers N]`: N processes on one port (SO_REUSEPORT), started by this one, so they
    share its session and with it one scheduler group (Linux autogroup), as `python -m gateway --workers N` does."""
    kind, port = sys.argv[1], int(sys.argv[2])
    body_file = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else ""
    workers = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 1
    reuse_port = "--reuse-port" in sys.argv or workers > 1
    ctx = multiprocessing.get_context("spawn")
    others = [ctx.Process(target=serve, args=(kind, port, body_file, True)) for _ in range(workers - 1)]
    for proc in others:
        proc.start()
    try:
        serve(kind, port, body_file, reuse_port)
    finally:
        for proc in others:
            proc.terminate()
            proc.join()


if __name__ == "__main__":
    main()
