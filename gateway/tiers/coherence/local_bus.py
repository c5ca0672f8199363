"""Invalidations between the workers of one `--workers N` gateway when there is no Redis.

The parent process owns a `LocalHub`: one connected unix socket pair per worker, and a thread that relays every
frame a worker sends to all the other workers. A worker's `LocalBus` writes its invalidations to its socket and
reads the others' from it. Frames are a 4-byte big-endian length and the message bytes.

The socket exists before the worker starts, so nothing sent to a worker is lost while it boots (the kernel
buffers it); the worker is `up()` from the start. End of file means the parent is gone: the worker is `down()`
for good (its L1 stays off), since nobody would relay purges to it any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import selectors
import socket
import struct
import threading
from dataclasses import dataclass

from gateway.tiers.coherence.bus import BusUnavailable, Receiver

log = logging.getLogger("tokenedge.bus")
_LEN = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class LocalBusEnd:
    """What a worker receives from the parent: its socket and how many other workers share the relay."""

    sock: socket.socket
    peers: int


class LocalBus:
    name = "local"

    def __init__(self, sock: socket.socket, peers: int) -> None:
        self._sock = sock
        self._peers = peers
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, receiver: Receiver) -> None:
        self._sock.setblocking(False)
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        receiver.up()
        self._task = asyncio.ensure_future(self._read(reader, receiver))

    async def _read(self, reader: asyncio.StreamReader, receiver: Receiver) -> None:
        try:
            while True:
                (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
                receiver.message(await reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            log.error("worker bus closed (%s): L1 off in this worker from now on", type(exc).__name__)
        finally:
            receiver.down()

    async def ack(self, raw: bytes) -> None:
        """Acks travel the same relay (the publisher waits for them)."""
        try:
            await self.publish(raw)
        except BusUnavailable as exc:
            log.warning("ack not sent: %s", exc)

    async def publish(self, raw: bytes) -> int:
        if self._writer is None or self._writer.is_closing() or self._task is None or self._task.done():
            raise BusUnavailable("the worker bus is closed")
        self._writer.write(_LEN.pack(len(raw)) + raw)
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise BusUnavailable(f"the worker bus failed: {exc}") from exc
        return self._peers

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()


class LocalHub:
    """The parent's relay: `worker_ends` go to the workers (one each); a daemon thread forwards frames."""

    def __init__(self, workers: int) -> None:
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(workers)]
        self._ends = [mine for mine, _ in pairs]
        self.worker_ends = [LocalBusEnd(theirs, workers - 1) for _, theirs in pairs]
        self._buffers = [bytearray() for _ in pairs]
        self._thread = threading.Thread(target=self._relay, name="tokenedge-bus-hub", daemon=True)

    def start(self) -> None:
        """Call after the workers have started: the parent's copies of their ends are closed here."""
        for end in self.worker_ends:
            end.sock.close()
        self._thread.start()

    def _relay(self) -> None:
        with selectors.DefaultSelector() as sel:
            for i, end in enumerate(self._ends):
                sel.register(end, selectors.EVENT_READ, i)
            while sel.get_map():
                for key, _ in sel.select():
                    if not self._pump(key.data):
                        sel.unregister(key.fileobj)

    def _pump(self, i: int) -> bool:
        """Read what worker i sent and forward every complete frame; False once worker i has closed."""
        try:
            data = self._ends[i].recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return False
        buf = self._buffers[i]
        buf += data
        while len(buf) >= _LEN.size:
            (size,) = _LEN.unpack_from(buf)
            if len(buf) < _LEN.size + size:
                break
            frame = bytes(buf[: _LEN.size + size])
            del buf[: _LEN.size + size]
            for j, end in enumerate(self._ends):
                if j != i:
                    with contextlib.suppress(OSError):  # a dead worker: the others still get the frame
                        end.sendall(frame)
        return True
