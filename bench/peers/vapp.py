"""Veracity's side of the side-by-side workloads (``bench.peers.vapp:app``)."""

from __future__ import annotations

from bench.peers import jobs
from veracity import App, Context

app = App("bench-peers")


@app.workflow("bench:peers/job.fn")
async def job(ctx: Context, kind: str, key: str) -> None:
    await jobs.run(kind, key)


async def _value(i: int) -> int:
    return i


@app.workflow("bench:peers/steps.fn")
async def three_steps(ctx: Context, key: str) -> int:
    total = 0
    for i in range(3):
        total += await ctx.step(_value, i)
    return total
