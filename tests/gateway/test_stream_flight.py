"""gateway/misses/streaming/broadcast.py: a flight's head reaches its waiters in one loop turn, and a waiter's
cancellation never cancels the head the other subscribers wait for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.misses.streaming.broadcast import Head, StreamFlight, StreamFlights
from gateway.web.errors import UpstreamError


@pytest.fixture
async def flight() -> AsyncIterator[StreamFlight]:
    parked = asyncio.Event()

    async def producer(_: StreamFlight) -> None:
        await parked.wait()  # the test plays the producer's part

    f = StreamFlights().start("k", complete_abandoned=False, abandoned_max_s=1.0, producer=producer)
    f.subscribe(lambda: True)
    yield f
    parked.set()


async def parked_waiter(flight: StreamFlight, order: list[str]) -> asyncio.Task[Head]:
    async def wait() -> Head:
        head = await flight.wait_head()
        order.append("waiter")
        return head

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)  # one turn: the task runs up to its wait (a yield, not a timed wait)
    return task


async def test_a_head_waiter_runs_in_the_turn_after_the_head(flight: StreamFlight) -> None:
    order: list[str] = []
    task = await parked_waiter(flight, order)
    head = Head(200, {"Content-Type": "text/event-stream"})
    flight.set_head(head)
    asyncio.get_running_loop().call_soon(order.append, "next turn")
    assert await task is head
    # a shielded await (or a done-callback hop) would let "next turn" run before the waiter
    assert order == ["waiter", "next turn"]


async def test_a_cancelled_wait_leaves_the_head_to_the_others(flight: StreamFlight) -> None:
    order: list[str] = []
    gone, staying = await parked_waiter(flight, order), await parked_waiter(flight, order)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert not flight.head.cancelled()
    flight.set_head(Head(200, {}))
    assert (await staying).status == 200


async def test_an_error_before_the_head_is_raised_in_every_waiter(flight: StreamFlight) -> None:
    order: list[str] = []
    tasks = [await parked_waiter(flight, order) for _ in range(2)]
    flight.set_head(UpstreamError("refused"))
    for task in tasks:
        with pytest.raises(UpstreamError, match="refused"):
            await task


async def test_a_head_set_on_the_future_itself_still_wakes_waiters(flight: StreamFlight) -> None:
    order: list[str] = []
    task = await parked_waiter(flight, order)
    flight.head.set_result(Head(204, {}))
    assert (await task).status == 204
    assert (await flight.wait_head()).status == 204  # after the head: no wait at all
