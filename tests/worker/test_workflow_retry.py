"""A workflow-level retry policy (``@app.workflow(..., retry=RetryPolicy(...))``), with a
worker in-process on both backends: a workflow that fails with its own error (or its
timeout) is tried again afresh after the policy's delay, with children and schedules of its
own; the last failure is recorded; nondeterminism is never retried (docs/workflows.md)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.worker.test_worker import (
    DEPLOYMENT,
    SETTINGS,
    events,
    running,
    submit,
    wait_status,
)
from veracity import App, Context, RetryPolicy
from veracity.core.states import Status
from veracity.store import Store, open_store
from veracity.worker.runner import Worker

app = App()
QUICK = RetryPolicy(max_attempts=3, initial_delay=0.05, backoff=1.0, jitter=0.0)
TRIES: Counter[str] = Counter()
STEPS: Counter[str] = Counter()


def count_step(key: str) -> int:
    STEPS[key] += 1
    return STEPS[key]


@app.workflow("retry:flaky/run.fn", retry=QUICK)
async def flaky(ctx: Context, key: str, fail_times: int) -> dict[str, Any]:
    """Fails its first ``fail_times`` tries after a step and a child; then succeeds. The
    step's count is the try's number: each try runs it afresh (a replay within a try
    returns the recorded count)."""
    try_number = await ctx.step(count_step, key)
    child = await ctx.call("retry:child/run.fn", key)
    if try_number <= fail_times:
        raise ValueError(f"try {try_number} fails")
    return {"try": try_number, "child": child}


@app.workflow("retry:child/run.fn")
async def child(ctx: Context, key: str) -> str:
    return f"child of {key}"


@app.workflow("retry:slow/run.fn", retry=QUICK, timeout=0.1)
async def slow(ctx: Context, key: str) -> None:
    TRIES[key] += 1
    await asyncio.sleep(5)


@app.workflow("retry:never/run.fn")
async def never(ctx: Context, key: str) -> None:
    TRIES[key] += 1
    raise ValueError("no policy, no retry")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await open_store(database_url, pool_size=4)
    try:
        yield opened
    finally:
        await opened.close()


def worker(store: Store) -> Worker:
    return Worker(store, app, settings=SETTINGS, deployment_id=DEPLOYMENT)


async def test_a_workflow_that_fails_is_retried_afresh_until_it_succeeds(store: Store) -> None:
    key = str(uuid.uuid4())
    e = await submit(store, "retry:flaky/run.fn", key, 2)
    async with running(worker(store)):
        done = await wait_status(store, e.id, Status.COMPLETED, Status.FAILED)
    # each try ran afresh: its step ran again (nothing replayed from a failed try)
    assert done.status == Status.COMPLETED, done.error
    assert done.result == {"try": 3, "child": f"child of {key}"}
    assert STEPS[key] == 3
    retries = [ev for ev in await events(store, e.id, "pending")
               if ev.data.get("reason") == "workflow retry"]
    assert [(r.data["retry"], r.data["of"], r.data["delay"]) for r in retries] == [
        (1, 2, 0.05), (2, 2, 0.05)]
    assert retries[0].data["error"]["message"] == "try 1 fails"
    assert done.attempt == 1  # workflow retries are not lease-recovery attempts
    # each try had a child of its own (three children, all completed)
    children, _ = await store.execution_children(e.id)
    assert len(children) == 3 and {c.status for c in children} == {Status.COMPLETED}
    assert len({c.id for c in children}) == 3


async def test_the_last_failure_is_recorded_when_the_tries_run_out(store: Store) -> None:
    key = str(uuid.uuid4())
    e = await submit(store, "retry:flaky/run.fn", key, 5)
    async with running(worker(store)):
        done = await wait_status(store, e.id, Status.FAILED)
    assert STEPS[key] == 3
    assert done.error["code"] == "workflow_error" and "try 3 fails" in done.error["message"]
    assert len([ev for ev in await events(store, e.id, "pending")
                if ev.data.get("reason") == "workflow retry"]) == 2


async def test_a_timed_out_workflow_is_retried_by_its_policy(store: Store) -> None:
    key = str(uuid.uuid4())
    e = await submit(store, "retry:slow/run.fn", key)
    async with running(worker(store)):
        done = await wait_status(store, e.id, Status.FAILED)
    assert TRIES[key] == 3 and done.error["code"] == "timeout"


async def test_without_a_policy_a_workflow_is_not_retried(store: Store) -> None:
    key = str(uuid.uuid4())
    e = await submit(store, "retry:never/run.fn", key)
    async with running(worker(store)):
        done = await wait_status(store, e.id, Status.FAILED)
    assert TRIES[key] == 1 and done.error["code"] == "workflow_error"


def test_retry_must_be_a_policy() -> None:
    with pytest.raises(TypeError, match="RetryPolicy"):
        App().workflow("x:y/z.w", retry=3)  # type: ignore[arg-type]
