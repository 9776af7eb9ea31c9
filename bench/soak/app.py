"""The soak's workflows (``bench.soak.app:app``): steps, durable sleeps, join sets, messages,
cancellable runs, and parents of runs delegated to the (fake) n8n.

Every step leaves evidence in a marks file: one JSON line written when the step's work is
done, naming the execution, the step, the fencing token (lease epoch) of the run that did it
and a token that the step also returns, so the checker can tell which run's work was
checkpointed and whether a run claimed after a checkpoint did the step again
(``bench/soak/checker.py``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import uuid
from pathlib import Path
from typing import Any

from veracity import App, Context

app = App("soak")

MARKS_ENV = "SOAK_MARKS_DIR"
"""The folder each worker process writes its marks file in (set by the soak)."""

STEPS = "soak:work/steps.run"
TICKER = "soak:work/ticker.run-cancellable"
SLEEPER = "soak:work/sleeper.run"
FANOUT = "soak:work/fanout.run"
FANOUT_CANCELLABLE = "soak:work/fanout.run-cancellable"
INBOX = "soak:work/inbox.run"
DELEGATOR = "soak:work/delegator.run"


def _marks_file() -> Path:
    folder = os.environ.get(MARKS_ENV)
    if not folder:
        raise RuntimeError(f"{MARKS_ENV} is not set: the soak sets it for its workers")
    return Path(folder) / f"marks-{os.getpid()}.jsonl"


def write_mark(record: dict[str, Any]) -> None:
    """Append one line with a single write on an O_APPEND descriptor: whole lines, even from
    a process killed with -9 right after (the data is in the kernel once write returns)."""
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(_marks_file(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def _work(epoch: int, execution_id: str, label: str, seconds: float) -> dict[str, str]:
    """A step's work: take some time, then leave the mark. ``epoch`` is bound with
    functools.partial, outside the step's recorded arguments (a replay under another lease
    makes the same call)."""
    await asyncio.sleep(seconds)
    token = uuid.uuid4().hex
    write_mark({"e": execution_id, "step": label, "epoch": epoch, "token": token,
                "pid": os.getpid()})
    return {"step": label, "token": token}


async def step(ctx: Context, label: str, seconds: float) -> Any:
    """One marked step. The run's lease epoch has no public accessor on Context; the soak
    reads it to tie each mark to the claim that did the work."""
    claim = ctx._claim
    assert claim is not None, "a workflow runs under a claim"
    epoch: int = claim.epoch
    fn = functools.partial(_work, epoch)
    return await ctx.step(fn, str(ctx.execution_id), label, seconds)


@app.workflow(STEPS)
async def steps(ctx: Context, n: int, seconds: float) -> list[str]:
    done = []
    for i in range(n):
        await step(ctx, f"s{i}", seconds)
        done.append(f"s{i}")
    return done


@app.workflow(TICKER)
async def ticker(ctx: Context, n: int, seconds: float) -> int:
    """Many short steps: a running execution to cancel (or pause) between two of them."""
    for i in range(n):
        await step(ctx, f"t{i}", seconds)
    return n


@app.workflow(SLEEPER)
async def sleeper(ctx: Context, seconds: float) -> str:
    await step(ctx, "before", 0.05)
    await ctx.sleep(seconds)
    await step(ctx, "after", 0.05)
    return "slept"


@app.workflow(FANOUT)
async def fanout(ctx: Context, children: int, n: int) -> list[str]:
    """Children in one join set, then a step; results in the order the children ended."""
    js = ctx.join_set()
    for _ in range(children):
        await js.submit(STEPS, n, 0.1)
    ended = []
    while js.remaining:
        outcome = await js.next()
        ended.append(str(outcome.status))
    await step(ctx, "joined", 0.05)
    return ended


@app.workflow(FANOUT_CANCELLABLE)
async def fanout_cancellable(ctx: Context, children: int, n: int) -> list[str]:
    """Cancellable children in one join set: a cancel reaches all of them."""
    js = ctx.join_set()
    for _ in range(children):
        await js.submit(TICKER, n, 0.2)
    ended = []
    while js.remaining:
        ended.append(str((await js.next()).status))
    return ended


@app.workflow(INBOX)
async def inbox(ctx: Context, topic: str, timeout: float) -> Any:
    await step(ctx, "before", 0.05)
    try:
        got = await ctx.recv(topic, timeout=timeout)
    except TimeoutError:
        got = "timed out"
    await step(ctx, "after", 0.05)
    return got


@app.workflow(DELEGATOR)
async def delegator(ctx: Context, external: str, order: str) -> Any:
    """A step, a run delegated to n8n as a child, another step."""
    await step(ctx, "before", 0.05)
    js = ctx.join_set()
    await js.submit(external, order)
    outcome = await js.next()
    await step(ctx, "after", 0.05)
    return {"child": str(outcome.status)}
