"""Tiny loopback servers the benchmarks compare against: a zero-latency OpenAI-style upstream, a bare aiohttp
app that returns fixed bytes (the floor any aiohttp-based gateway is measured against for hits) and a bare aiohttp
streaming reverse proxy (the floor for misses: one more hop, nothing else).

`python -m harness.peers.servers upstream PORT` / `python -m harness.peers.servers bare PORT BODY_FILE` /
`python -m harness.peers.servers proxy PORT UPSTREAM_URL` /
`python -m harness.peers.servers sink PORT` (an OTLP/HTTP trace collector that keeps nothing).
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import AsyncIterator
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


def proxy_app(upstream: str) -> web.Application:
    """POST bodies relayed to `upstream` (same path) with the caller's Content-Type and Authorization, and the
    answer streamed back chunk by chunk as it arrives: what any aiohttp proxy pays for a miss, and nothing more."""
    import aiohttp

    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[session_key] = aiohttp.ClientSession(auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
        yield
        await app[session_key].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with request.app[session_key].post(upstream + request.path, data=body, headers=headers) as resp:
            out = web.StreamResponse(status=resp.status, headers={"Content-Type": resp.content_type})
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/{endpoint:.+}", relay)
    app.router.add_get("/health", health)
    return app


def serve(kind: str, port: int, body_file: str, reuse_port: bool) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    apps = {"upstream": upstream_app, "sink": sink_app}
    if kind == "proxy":  # its third argument is the upstream's URL
        app = proxy_app(body_file.rstrip("/"))
    else:
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
