"""The gateway hit benchmarks' shared parts: the request and its headers, a target (URL, pids to charge CPU to,
body, headers, ingress-shaped or not), priming a hit, a Redis for L2, and the interleaved wrk rounds."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from bench.measure.load import UNIQUE, LoadResult, median_result, wrk
from harness.services import RedisServer

REQUEST = (
    b'{"model":"bench-model","temperature":0,"max_tokens":64,'
    b'"messages":[{"role":"system","content":"You are terse."},'
    b'{"role":"user","content":"What is the capital of France?"}]}'
)

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench-tenant"}

Target = tuple[str, list[int], bytes, dict[str, str], bool]  # ..., ingress: a unique request id per request


def post(url: str, body: bytes = REQUEST, headers: dict[str, str] = HEADERS) -> tuple[bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read(), dict(resp.headers)


def prime(url: str) -> bytes:
    """Post until a hit comes back (each worker has its own L1; a fresh connection may reach any of them)."""
    for _ in range(50):
        body, headers = post(url, REQUEST, HEADERS)
        if headers["Cache-Status"].startswith("tokenedge; hit"):
            return body
    raise RuntimeError(f"no cache hit from {url} after 50 identical requests")


@contextmanager
def redis_server() -> Iterator[str]:
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def measure(
    targets: dict[str, Target], *, duration_s: int, repeats: int, connections: int, warm: int
) -> dict[str, LoadResult]:
    for url, _pids, body, headers, _ingress in targets.values():
        for i in range(warm):
            post(url, body.replace(UNIQUE, f"warm-{i}".encode()), headers)
    runs: dict[str, list[LoadResult]] = {name: [] for name in targets}
    for _ in range(repeats):  # interleaved repeats: noise on this shared machine hits every system alike
        for name, (url, pids, body, headers, ingress) in targets.items():
            runs[name].append(
                wrk(
                    url,
                    body=body,
                    headers=headers,
                    duration_s=duration_s,
                    connections=connections,
                    threads=1,
                    pids=pids,
                    ingress=ingress,
                )
            )
    return {name: median_result(results) for name, results in runs.items()}
