"""A workflow-level retry policy (``@app.workflow(..., retry=RetryPolicy(...))``), with a
worker in-process on both backends: a workflow that fails with its own error (or its
timeout) is tried again afresh after the policy's delay, with children and schedules of its
own; the last failure is recorded; nondeterminism is never retried (docs/workflows.md)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest

from tests._helpers import events, store_fixture, wait_status
from tests.worker.test_worker import DEPLOYMENT, SETTINGS, running, submit
from veracity import App, Context, RetryPolicy
from veracity.core.states import Status
from veracity.models import ExecutionFilter
from veracity.store import Store
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


store = store_fixture(pool_size=4)


def worker(store: Store, deployment_id: str = DEPLOYMENT) -> Worker:
    return Worker(store, app, settings=SETTINGS, deployment_id=deployment_id)


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


# -- an operator's retry of a failed execution (veracity retry, PUT .../retry) ---------------

BROKEN: set[str] = set()
RAN: Counter[str] = Counter()


class Broken(Exception):
    pass


def work(key: str, i: int) -> str:
    RAN[f"{key}:{i}"] += 1
    if i == 2 and key in BROKEN:
        raise Broken(f"step {i} is broken")
    return f"{key}:{i}"


@app.workflow("retry:three/run.fn")
async def three(ctx: Context, key: str) -> list[str]:
    done = []
    for i in range(4):
        done.append(await ctx.step_with(work, key, i, retry=RetryPolicy(
            max_attempts=1)))
    return done


async def test_an_operator_retry_replays_up_to_the_failure_and_runs_on(store: Store) -> None:
    from veracity.control import ExecutionService

    key = str(uuid.uuid4())
    BROKEN.add(key)
    e = await submit(store, "retry:three/run.fn", key)
    async with running(worker(store)):
        failed = await wait_status(store, e.id, Status.FAILED)
    assert [RAN[f"{key}:{i}"] for i in range(4)] == [1, 1, 1, 0]
    before = (await store.execution_get(e.id), await store.history_list(e.id))

    BROKEN.discard(key)  # the bug is fixed; retry
    service = ExecutionService(store, workflows=set(app.workflows), deployment_id="d-new")
    retried = await service.retry(e.id, actor="ops")

    assert (retried.status, retried.retry_of, retried.deployment_id) == (
        Status.PENDING, e.id, "d-new")
    assert retried.params == failed.params and retried.id != e.id
    first = (await store.history_list(retried.id))[0]
    assert first.kind == "pending" and first.data["retry_of"] == str(e.id)
    assert first.data["replays"] == 2 and first.data["by"] == "ops"
    # the retry belongs to the current deployment: its workers run it
    async with running(worker(store, "d-new")):
        done = await wait_status(store, retried.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    assert done.result == [f"{key}:{i}" for i in range(4)]
    # steps 0 and 1 were replayed, not run again; the failed step ran again, then step 3
    assert [RAN[f"{key}:{i}"] for i in range(4)] == [1, 1, 2, 1]
    # the failed execution is unchanged
    assert (await store.execution_get(e.id), await store.history_list(e.id)) == before


@pytest.mark.parametrize("status", ["pending", "completed", "cancelled"])
async def test_only_a_failed_execution_can_be_retried(store: Store, status: str) -> None:
    from veracity.control import ExecutionService
    from veracity.errors import Conflict

    service = ExecutionService(store, workflows=set(app.workflows), deployment_id="d")
    e = await submit(store, "retry:child/run.fn", "k")
    if status == "completed":
        async with running(worker(store)):
            await wait_status(store, e.id, Status.COMPLETED)
    elif status == "cancelled":
        e = await submit(store, "retry:never/run.fn", "k")
        await store.execution_cancel(e.id, actor="t")
    before = await store.history_list(e.id)
    count = len(await store.execution_list(ExecutionFilter(), limit=100))
    with pytest.raises(Conflict) as refused:
        await service.retry(e.id)
    assert refused.value.code == "wrong_state" and refused.value.details["state"] == status
    assert await store.history_list(e.id) == before
    assert len(await store.execution_list(ExecutionFilter(), limit=100)) == count
