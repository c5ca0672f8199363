"""The L2 read path's own Redis connection: batched MGETs on one pipelined connection, replies parsed by hiredis.

Every L2 hit waits on an MGET (`RedisTier._read_batches` sends one per batch of reads in flight). Through
redis-py's asyncio client an MGET costs about 70 µs of CPU here (command packing, a pooled connection taken and
returned, asyncio streams, a task wake-up per reply); written on a plain asyncio protocol and parsed with hiredis
in the read callback it costs about 17 µs, and that cost is paid per batch, on every L2 hit's path. So reads go
through this when Redis is reached over plain TCP (a `redis://` URL, RESP2; AUTH and SELECT from the URL as
redis-py parses it); TLS, unix sockets and Redis Cluster keep redis-py. Writes, purges and everything else keep
redis-py too.

Failures are redis-py's exception types, so the tier's breaker treats them alike: a connection that cannot be made
or is lost fails every read waiting on it (`ConnectionError`), a read that outlives the socket timeout closes the
connection (`TimeoutError`: later replies could no longer be matched to their reads), and the next read connects
again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import hiredis
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


def pack(*args: str | bytes) -> bytes:
    """One RESP2 command: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Replies(asyncio.Protocol):
    """One connection: commands written in order, each reply handed to the read that waits for it."""

    def __init__(self) -> None:
        self._parser = hiredis.Reader(replyError=ResponseError, protocolError=InvalidResponse)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def call(self, command: bytes) -> asyncio.Future[Any]:
        if self.transport is None or self.transport.is_closing():
            raise RedisConnectionError("the L2 read connection is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self.transport.write(command)
        return future

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        try:
            while (reply := self._parser.gets()) is not False:
                future = self._waiting.popleft()
                if future.done():  # its read gave up (a timeout closes the connection, so this is rare)
                    continue
                if isinstance(reply, ResponseError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except (InvalidResponse, IndexError) as exc:  # not Redis, or a reply nobody asked for
            self.close(RedisConnectionError(f"the L2 read connection broke: {exc!r}"))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self._fail(RedisConnectionError(f"the L2 read connection was lost: {exc or 'closed'}"))

    def close(self, why: Exception) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self._fail(why)

    def _fail(self, why: Exception) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(why)


class BatchReads:
    """MGET over one pipelined connection, (re)connected on demand."""

    def __init__(self, settings: dict[str, Any], timeout_s: float) -> None:
        self._host = str(settings.get("host", "localhost"))
        self._port = int(settings.get("port", 6379))
        self._db = int(settings.get("db", 0) or 0)
        self._username = settings.get("username")
        self._password = settings.get("password")
        self._timeout_s = timeout_s
        self._conn: _Replies | None = None
        self._connecting: asyncio.Lock | None = None

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        conn = await self._connection()
        try:
            async with asyncio.timeout(self._timeout_s):
                return list(await conn.call(pack("MGET", *keys)))
        except TimeoutError:
            conn.close(RedisConnectionError("closed after a read timed out"))
            raise RedisTimeoutError(f"L2 read timed out after {self._timeout_s} s") from None

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close(RedisConnectionError("the L2 tier is closing"))
            self._conn = None

    async def _connection(self) -> _Replies:
        conn = self._conn
        if conn is not None and conn.transport is not None:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # one connect at a time; the others use it
            if self._conn is None or self._conn.transport is None:
                self._conn = await self._connect()
            return self._conn

    async def _connect(self) -> _Replies:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_s):
                _, conn = await loop.create_connection(_Replies, self._host, self._port)
                try:
                    for command in self._setup():
                        await conn.call(command)  # a refusal raises ResponseError (a RedisError)
                except BaseException as exc:
                    conn.close(RedisConnectionError(f"connection setup failed: {exc!r}"))
                    raise
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(f"cannot reach Redis at {self._host}:{self._port}: {exc!r}") from exc
        return conn

    def _setup(self) -> list[bytes]:
        """AUTH and SELECT, as the URL asks."""
        setup = []
        if self._password is not None:
            auth = (self._username, self._password) if self._username else (self._password,)
            setup.append(pack("AUTH", *auth))
        if self._db:
            setup.append(pack("SELECT", str(self._db)))
        return setup


def batch_reads_for(client: Any, timeout_s: float) -> BatchReads | None:
    """A `BatchReads` with the client's own connection settings, when it reaches Redis over plain TCP with RESP2;
    else None (the reads stay on redis-py)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or pool.connection_class is not Connection:
        return None
    settings = dict(pool.connection_kwargs)
    if settings.get("protocol") not in (None, 2, "2"):
        return None
    return BatchReads(settings, timeout_s)
