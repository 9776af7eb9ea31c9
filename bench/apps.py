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
