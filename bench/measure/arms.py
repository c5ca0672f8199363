"""A gateway setting on and off across replicas, alternated twice against one redis-server and a slow in-process
upstream (the leases and warmup scenarios): the upstream, the request body, the alternation and its table."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import orjson
from aiohttp import web

from harness.services import RedisServer, serving

GENERATION_S = 0.2
Row = dict[str, float]


class SlowUpstream:
    def __init__(self) -> None:
        self.calls = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "m", "object": "model", "tokenedge": {"revision": "r1"}}]}
        )

    async def chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        n = self.calls
        await asyncio.sleep(GENERATION_S)  # the model generating
        return web.json_response(
            {
                "id": f"c{n}",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"#{n}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            }
        )


Fake = TypeVar("Fake", bound=SlowUpstream)


def body(text: str) -> bytes:
    return orjson.dumps({"model": "m", "temperature": 0, "messages": [{"role": "user", "content": text}]})


async def alternate(
    fake: Fake, mode: str, run: Callable[[str, RedisServer, Fake, bool, str], Awaitable[Row]]
) -> list[tuple[str, Row]]:
    """`run(upstream URL, redis, fake, on, tag)` with the mode off then on, twice (drift on a shared machine hits
    both alike), against one redis-server and `fake` served on loopback; both stopped at the end. Rows are named
    "<mode> on|off (run N)"."""
    redis = RedisServer()
    redis.start()
    rows = []
    try:
        async with serving(fake.app()) as url:
            for attempt in range(2):
                for on in (False, True):
                    row = await run(url, redis, fake, on, f"{on}-{attempt}")
                    rows.append((f"{mode} {'on' if on else 'off'} (run {attempt + 1})", row))
    finally:
        redis.stop()
    return rows


def print_modes(title: str, columns: str, cells: str, rows: Sequence[tuple[str, Row]]) -> None:
    """The rows of `alternate` as a markdown table: a "mode" column, then `columns` ("a | b | ..."), each row's
    values by the format string `cells` ("{a:.2f} | {b:.1f} | ...")."""
    print(title)
    print(f"| mode | {columns} |")
    print("|---" * (columns.count("|") + 2) + "|")
    for name, row in rows:
        print(f"| {name} | {cells.format_map(row)} |")
