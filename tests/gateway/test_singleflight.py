"""Single-flight: one call per key at a time, errors to every waiter, a leader's cancellation spares followers."""

from __future__ import annotations

import asyncio

import pytest

from gateway.misses.singleflight import SingleFlight


async def test_concurrent_callers_share_one_call() -> None:
    flights: SingleFlight[int] = SingleFlight()
    release = asyncio.Event()
    calls = 0

    async def work() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return 42

    tasks = [asyncio.create_task(flights.do("k", work)) for _ in range(10)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks)
    assert calls == 1
    assert [r for r, _ in results] == [42] * 10
    assert sum(leader for _, leader in results) == 1
    assert len(flights) == 0


async def test_error_reaches_every_waiter() -> None:
    flights: SingleFlight[int] = SingleFlight()
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        raise ValueError("boom")

    tasks = [asyncio.create_task(flights.do("k", work)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, ValueError) for r in results)
    assert len(flights) == 0


async def test_cancelled_leader_does_not_cancel_the_call_for_followers() -> None:
    flights: SingleFlight[int] = SingleFlight()
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        return 7

    leader = asyncio.create_task(flights.do("k", work))
    await asyncio.sleep(0)
    follower = asyncio.create_task(flights.do("k", work))
    await asyncio.sleep(0)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    release.set()
    assert await follower == (7, False)


async def test_different_keys_do_not_coalesce() -> None:
    flights: SingleFlight[str] = SingleFlight()

    async def work(value: str) -> str:
        return value

    results = await asyncio.gather(flights.do("a", lambda: work("a")), flights.do("b", lambda: work("b")))
    assert results == [("a", True), ("b", True)]
