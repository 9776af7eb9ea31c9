"""Workflows the benchmarks run (``bench.apps:app``)."""

from __future__ import annotations

import asyncio
from typing import Any

from veracity import App, Context

app = App("bench")


@app.workflow("bench:noop/run.fn")
async def noop(ctx: Context, *args: Any) -> None:
    return None


async def _nap(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def _value(i: int) -> int:
    return i


@app.workflow("bench:steps/run.fn")
async def three_steps(ctx: Context) -> int:
    total = 0
    for i in range(3):
        total += await ctx.step(_value, i)
    return total


@app.workflow("bench:slow/run.fn")
async def slow(ctx: Context, steps: int, seconds: float) -> int:
    for _ in range(steps):
        await ctx.step(_nap, seconds)
    return steps


@app.workflow("bench:chain/run.fn")
async def chain(ctx: Context, depth: int) -> int:
    """A chain of children ``depth`` deep: each level calls the next and waits for it, so
    every hop is a child's end waking its parent."""
    if depth <= 0:
        return 0
    return 1 + int(await ctx.call("bench:chain/run.fn", depth - 1))


def _tick(i: int) -> int:
    return i


@app.workflow("bench:ticker/run.fn-cancellable")
async def ticker(ctx: Context, n: int) -> int:
    """Many short steps: a running execution to cancel or pause at a step boundary."""
    total = 0
    for i in range(n):
        total += await ctx.step(_tick, i)
    return total
