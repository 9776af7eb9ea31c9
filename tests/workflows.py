"""Workflows used by the tests, importable by worker subprocesses as ``tests.workflows:app``.

Steps that must be observed across processes append a line to a file named by their
arguments, so a test can count how often each step really ran.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from veracity import App, Context, RetryPolicy

app = App("tests")


def mark(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def count_marks(path: str | Path, line: str) -> int:
    p = Path(path)
    if not p.exists():
        return 0
    return sum(1 for x in p.read_text().splitlines() if x == line)


@app.workflow("test:noop/run.fn")
async def noop(ctx: Context, *args: Any) -> None:
    return None


@app.workflow("test:echo/run.fn")
async def echo(ctx: Context, value: Any) -> Any:
    return value


async def _sleep_then_mark(path: str, line: str, seconds: float) -> str:
    await asyncio.sleep(seconds)
    mark(path, line)
    return line


@app.workflow("test:steps/run.fn")
async def steps(ctx: Context, marks: str, n: int, seconds: float) -> list[str]:
    """n checkpointed steps, each sleeping ``seconds`` then marking ``<execution>:<i>``."""
    done = []
    for i in range(n):
        done.append(await ctx.step(_sleep_then_mark, marks, f"{ctx.execution_id}:{i}", seconds))
    return done


def _blocking_sleep_then_mark(path: str, line: str, seconds: float) -> str:
    time.sleep(seconds)
    mark(path, line)
    return line


@app.workflow("test:finish/run.fn")
async def finish(ctx: Context, marks: str, seconds: float) -> str:
    """One step that takes ``seconds``, then completes: for stalled-worker tests."""
    await ctx.step(_blocking_sleep_then_mark, marks, f"{ctx.execution_id}:step", seconds)
    return f"done by pid {os.getpid()}"


class Boom(Exception):
    pass


def _boom() -> None:
    raise Boom("kaput")


@app.workflow("test:fail/run.fn")
async def fail(ctx: Context) -> None:
    await ctx.step_with(_boom, retry=RetryPolicy(max_attempts=2, initial_delay=0.01))


@app.workflow("test:raise/run.fn")
async def raise_(ctx: Context) -> None:
    raise ValueError("the workflow's own error")


@app.workflow("test:notjson/run.fn")
async def not_json(ctx: Context) -> object:
    return {1, 2, 3}


@app.workflow("test:timeout/run.fn", timeout=0.2)
async def times_out(ctx: Context) -> None:
    await asyncio.sleep(5)
