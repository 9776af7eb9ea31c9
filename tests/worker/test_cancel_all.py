"""A worker's stop cancels its helper loops until they end (veracity.worker.runner.cancel_all),
even one that lost a cancel inside a library and went on."""

from __future__ import annotations

import asyncio

import pytest

from veracity.worker.runner import cancel_all


async def test_a_loop_that_swallows_a_cancel_is_cancelled_again() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed == 2:
                    raise
                swallowed += 1  # lost, as inside a library: the loop goes on

    async def plain() -> None:
        await asyncio.sleep(3600)

    async def failed() -> None:
        raise ValueError("ended with an error before the stop")

    tasks = [asyncio.create_task(f()) for f in (stubborn, plain, failed)]
    await asyncio.sleep(0.01)
    async with asyncio.timeout(5):
        await cancel_all(tasks, again_after=0.05)
    assert swallowed == 2
    assert tasks[0].cancelled() and tasks[1].cancelled(), tasks
    with pytest.raises(ValueError):
        tasks[2].result()


async def test_nothing_to_cancel() -> None:
    await cancel_all([])
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_all([done])
    assert done.done() and not done.cancelled()
