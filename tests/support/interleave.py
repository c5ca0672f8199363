"""A scheduler for concurrency tests over real services: every round trip to a shared tier parks before it is sent and
after its answer, and one parked call at a time is released in an order a seeded RNG draws, so a test can interleave
concurrent operations at every await between a tier read and its use, reproducibly (tests/gateway/
test_coherence_property.py). Plus the in-process invalidation bus two workers of one test share.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Coroutine
from typing import Any

SETTLE_YIELDS = 12  # loop turns given to whatever a release made runnable before the next release


class Interleaver:
    """Every shared-tier round trip parks here before it is sent and after its answer; `run` releases one parked
    call at a time, drawn by the seeded RNG, once no round trip is in flight and what was made runnable has run to
    its next park, until the round's operations are done. One round trip at a time: the interleaving is the seed's."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.parked: list[asyncio.Future[None]] = []
        self.wake = asyncio.Event()
        self.busy = 0  # round trips in flight
        self.on = True

    async def point(self) -> None:
        if not self.on:
            return
        parked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parked.append(parked)
        self.wake.set()
        await parked

    async def around(self, call: Awaitable[Any]) -> Any:
        await self.point()
        self.busy += 1
        try:
            result = await call
        finally:
            self.busy -= 1
            self.wake.set()
        await self.point()
        return result

    async def run(self, ops: list[Coroutine[Any, Any, None]]) -> None:
        tasks = [asyncio.ensure_future(op) for op in ops]
        for task in tasks:
            task.add_done_callback(lambda _: self.wake.set())
        while True:
            self.wake.clear()
            for _ in range(SETTLE_YIELDS):
                await asyncio.sleep(0)
            self.parked = [p for p in self.parked if not p.done()]
            if self.parked and not self.busy:
                self.parked.pop(self.rng.randrange(len(self.parked))).set_result(None)
            elif all(task.done() for task in tasks):
                break
            else:
                await self.wake.wait()
        for task in tasks:
            task.result()


class Slowed:
    """A client whose every awaited call (commands, scripts, pipelines) goes through the interleaver."""

    def __init__(self, real: Any, gate: Interleaver) -> None:
        self._real = real
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr
        if name == "register_script":
            return lambda *args, **kwargs: Slowed(attr(*args, **kwargs), self._gate)
        if name == "pipeline":
            return lambda *args, **kwargs: SlowedPipeline(attr(*args, **kwargs), self._gate)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            return self._gate.around(result) if inspect.isawaitable(result) else result

        return call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # a registered script
        return self._gate.around(self._real(*args, **kwargs))


class SlowedPipeline:
    """A pipeline: commands queue as they do (a pipeline is itself awaitable), `execute` goes through the gate."""

    def __init__(self, real: Any, gate: Interleaver) -> None:
        self._real = real
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def execute(self) -> Awaitable[Any]:
        return self._gate.around(self._real.execute())


class MemoryHub:
    """The bus between the workers (`--workers N`' relay in-process): delivery on publish, acks as tasks."""

    def __init__(self) -> None:
        self.receivers: list[Any] = []


class MemoryBus:
    name = "memory"

    def __init__(self, hub: MemoryHub) -> None:
        self._hub = hub
        self._me: Any = None

    async def start(self, receiver: Any) -> None:
        self._me = receiver
        self._hub.receivers.append(receiver)
        receiver.up()

    async def publish(self, raw: bytes) -> int:
        others = [r for r in self._hub.receivers if r is not self._me]
        for receiver in others:
            receiver.message(raw)
        return len(others)

    async def ack(self, raw: bytes) -> None:
        for receiver in self._hub.receivers:
            receiver.message(raw)

    async def close(self) -> None:
        self._hub.receivers.remove(self._me)
