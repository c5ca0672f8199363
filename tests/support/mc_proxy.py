"""A counting TCP proxy in front of memcached: it tallies the commands clients send, by verb.

memcached's own stats count keys, not requests, so the hot-path guard counts round trips here: every text-protocol
command line is one request the client then waits on (storage commands' data blocks are skipped, not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

_STORAGE = {b"set", b"add", b"replace", b"append", b"prepend", b"cas"}


class CountingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.commands: Counter[str] = Counter()
        self.keys_per_get: list[int] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        back = asyncio.ensure_future(self._pipe(up_reader, writer))
        self._tasks.add(back)
        try:
            while line := await reader.readline():
                verb, *args = line.split() or [b""]
                self.commands[verb.decode()] += 1
                if verb in (b"get", b"gets"):
                    self.keys_per_get.append(len(args))
                up_writer.write(line)
                if verb in _STORAGE:
                    up_writer.write(await reader.readexactly(int(args[3]) + 2))
                await up_writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            up_writer.close()
            writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
