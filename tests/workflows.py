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


@app.workflow("test:span/run.fn")
async def span(ctx: Context, marks: str, seconds: float) -> int:
    """Marks ``<pid> +1 <execution>`` as its code starts and ``<pid> -1 <execution>`` as it
    ends, ``seconds`` later (no fsync: for counting how many run at once in each worker
    process, not for surviving a crash)."""
    with open(marks, "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()} +1 {ctx.execution_id}\n")
    await asyncio.sleep(seconds)
    with open(marks, "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()} -1 {ctx.execution_id}\n")
    return os.getpid()


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


# -- the durable engine (sleep, children, messages, cancel, pause) --------------------------


@app.workflow("test:sleep/run.fn")
async def sleeper(ctx: Context, seconds: float) -> str:
    before = ctx.now()
    await ctx.sleep(seconds)
    return f"slept since {before.isoformat()}"


@app.workflow("test:parent/run.fn")
async def parent(ctx: Context, values: list[Any]) -> list[Any]:
    """Children in one join set; results in the order the children ended."""
    js = ctx.join_set()
    for value in values:
        await js.submit("test:echo/run.fn", value)
    out = []
    for _ in values:
        outcome = await js.next()
        out.append(outcome.result)
    return out


@app.workflow("test:call/run.fn")
async def caller(ctx: Context, value: Any) -> Any:
    return await ctx.call("test:echo/run.fn", value)


@app.workflow("test:recv/run.fn")
async def receiver(ctx: Context, topic: str, timeout: float | None = None) -> Any:
    try:
        return await ctx.recv(topic, timeout=timeout)
    except TimeoutError:
        return "timed out"


@app.workflow("test:schedule/run.fn")
async def scheduler(ctx: Context, value: Any) -> str:
    scheduled = await ctx.schedule("test:echo/run.fn", value)
    return str(scheduled)


@app.workflow("test:waiter/wait.run-cancellable")
async def waiter(ctx: Context, topic: str) -> Any:
    """Cancellable: waits for a message forever."""
    return await ctx.recv(topic)


@app.workflow("test:mid/run.fn")
async def middle(ctx: Context, topic: str) -> Any:
    """Not cancellable; waits for a cancellable child that waits for a message."""
    return await ctx.call("test:waiter/wait.run-cancellable", topic)


@app.workflow("test:top/top.run-cancellable")
async def top(ctx: Context, topic: str) -> Any:
    """Three levels: top (cancellable) -> mid (not) -> waiter (cancellable); plus a direct
    cancellable child that waits too."""
    js = ctx.join_set()
    await js.submit("test:mid/run.fn", topic)
    await js.submit("test:waiter/wait.run-cancellable", topic + "-direct")
    first = await js.next()
    second = await js.next()
    return [first.result, second.result]


def _read_flag(path: str) -> bool:
    return Path(path).exists()


@app.workflow("test:changing/run.fn")
async def changing(ctx: Context, flag: str) -> str:
    """Calls a different step after a restart if ``flag`` exists: nondeterminism."""
    if Path(flag).exists():
        await ctx.step(_blocking_sleep_then_mark, flag + ".marks", "b", 0.0)
    else:
        await ctx.step(_read_flag, flag)
    await ctx.sleep(0.3)
    return "done"


async def _tick(i: int) -> int:
    await asyncio.sleep(0.05)
    return i


@app.workflow("test:ticker/tick.run-cancellable")
async def ticker(ctx: Context, n: int) -> int:
    """Many short steps: a running execution to cancel or pause at a step boundary."""
    total = 0
    for i in range(n):
        total += await ctx.step(_tick, i)
    return total


@app.workflow("test:ticker/tick.run")
async def ticker_plain(ctx: Context, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(_tick, i)
    return total


async def _mark_now(path: str, line: str) -> str:
    mark(path, line)
    return line


@app.workflow("test:lastwrite/run.fn")
async def last_write(ctx: Context, marks: str, seconds: float) -> str:
    """One quick checkpointed step, then a plain ``asyncio.sleep`` in the workflow body (not
    a step, not durable) before returning: a worker stopped during that sleep has only its
    completion left to write. The result names the process that completed it."""
    await ctx.step(_mark_now, marks, f"{ctx.execution_id}:step")
    await asyncio.sleep(seconds)
    return f"completed by pid {os.getpid()}"


@app.workflow("test:gc/settings.fn")
async def gc_settings(ctx: Context) -> dict[str, Any]:
    """The collector's settings of the process running it (veracity/_heap.py)."""
    import gc

    return {"young": gc.get_threshold()[0], "frozen": gc.get_freeze_count() > 0}
