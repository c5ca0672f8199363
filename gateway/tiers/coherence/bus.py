"""What a bus is to the rest of the gateway: a publisher of invalidations and a feed of them into a receiver.

Two implementations: `RedisBus` (pub/sub on the shared Redis: every worker and every replica) and `LocalBus`
(a socket to the parent process of `--workers N`, which relays between its workers when there is no Redis).
Both report the subscription's state to the receiver: `down()` the moment it may have missed a message,
`up()` once it is certain to receive every later one.
"""

from __future__ import annotations

from typing import Protocol


class BusUnavailable(Exception):
    """A publish did not reach the bus; the purge result reports it instead of pretending it was applied."""


class Receiver(Protocol):
    def message(self, raw: bytes) -> None: ...
    def up(self) -> None: ...
    def down(self) -> None: ...


class Bus(Protocol):
    name: str

    async def start(self, receiver: Receiver) -> None:
        """Begin receiving; returns once subscribed, or after a bounded wait with the receiver still down."""
        ...

    async def publish(self, raw: bytes) -> int:
        """Send to every other subscribed process; the number of receivers when the bus knows it."""
        ...

    async def ack(self, raw: bytes) -> None:
        """Tell observers (benchmarks, operators) that this process applied a message; best effort."""
        ...

    async def close(self) -> None: ...
