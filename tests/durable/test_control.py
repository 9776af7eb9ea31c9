"""Cancel, pause and unpause through the HTTP API (in-process) with a worker running, on
both backends: the cancellation rules of docs/workflows.md (only -cancellable, at once when
not running,
at the next await when running, idempotent, recursive with non-cancellable children left to
finish, racing completion), and pause/unpause in every non-terminal state."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests import workflows
from tests.durable._support import (
    SETTINGS,
    error_of,
    events,
    get,
    history,
    kinds,
    make_worker,
    running,
    until,
    wait_kind,
    wait_status,
)
from veracity import App, Context
from veracity.config import WorkerSettings
from veracity.core.states import TERMINAL, Status
from veracity.models import Execution
from veracity.store import Store
from veracity.worker.context import RECV_STARTED, SLEEP_STARTED, STEP_COMPLETED
from veracity.worker.runner import Worker

# The workflows of tests.workflows, plus gated ones whose steps wait for the test.
app = App("engine-control")
for _ffqn, _wf in workflows.app.workflows.items():
    app.workflow(_ffqn, timeout=_wf.timeout)(_wf.fn)

GATES: dict[str, asyncio.Event] = {}
CALLS: dict[str, int] = {}


def gate(key: str) -> asyncio.Event:
    return GATES.setdefault(key, asyncio.Event())


async def wait_gate(key: str) -> str:
    """A step that runs until the test opens ``key``."""
    CALLS[key] = CALLS.get(key, 0) + 1
    gate(f"{key}:entered").set()
    await gate(key).wait()
    return key


def counted(key: str) -> str:
    CALLS[key] = CALLS.get(key, 0) + 1
    return key


@app.workflow("engc:gated/run.fn-cancellable")
async def gated(ctx: Context, key: str, last: bool) -> list[str]:
    """A step, a gated step, then (unless ``last``) one more step."""
    out = [await ctx.step(counted, f"{key}:before"), await ctx.step(wait_gate, key)]
    if not last:
        out.append(await ctx.step(counted, f"{key}:after"))
    return out


@app.workflow("engc:gatedplain/run.fn")
async def gated_plain(ctx: Context, key: str) -> list[str]:
    return [await ctx.step(wait_gate, key), await ctx.step(counted, f"{key}:after")]


@app.workflow("engc:thenwait/run.fn-cancellable")
async def then_wait(ctx: Context, key: str, kind: str) -> Any:
    """A gated step, then a durable wait (a long sleep, or a receive)."""
    await ctx.step(wait_gate, key)
    if kind == "sleep":
        await ctx.sleep(60)
        return "slept"
    return await ctx.recv("go")


@app.workflow("engc:keeps/run.fn-cancellable")
async def keeps(ctx: Context, key: str, topic: str) -> Any:
    """Cancellable; its child (test:recv, not cancellable) waits for a message; it sleeps
    a little, then runs a step and waits for the child."""
    js = ctx.join_set()
    await js.submit("test:recv/run.fn", topic)
    await ctx.sleep(0.3)
    await ctx.step(counted, f"{key}:after-sleep")
    return (await js.next()).result


@pytest.fixture(autouse=True)
def _reset() -> None:
    GATES.clear()
    CALLS.clear()


@pytest.fixture
def worker(store: Store) -> Worker:
    return make_worker(store, app)


@pytest.fixture
async def live(worker: Worker) -> AsyncIterator[Worker]:
    async with running(worker):
        yield worker


# -- helpers -----------------------------------------------------------------------------------


async def api_submit(client: httpx.AsyncClient, ffqn: str, *params: Any,
                     **extra: Any) -> dict[str, Any]:
    response = await client.post("/v1/executions",
                                 json={"ffqn": ffqn, "params": list(params), **extra})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def control(client: httpx.AsyncClient, execution_id: uuid.UUID | str, action: str,
                  expect: int = 200) -> dict[str, Any]:
    response = await client.put(f"/v1/executions/{execution_id}/{action}")
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


async def message(client: httpx.AsyncClient, execution_id: uuid.UUID | str, topic: str,
                  payload: Any, expect: int = 201) -> dict[str, Any]:
    response = await client.post(f"/v1/executions/{execution_id}/messages",
                                 json={"topic": topic, "payload": payload})
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


def later(seconds: float = 3600) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def interrupted(worker: Worker, execution_id: uuid.UUID, kind: str) -> None:
    """Wait until the worker has told the run of ``execution_id`` to stop."""

    async def check() -> bool:
        run = worker.runs.get(execution_id)
        return run is not None and run.ctx is not None and run.ctx.interrupted == kind

    await until(check, timeout=5, what=f"the worker to see the {kind} of {execution_id}")


async def entered(key: str) -> None:
    await asyncio.wait_for(gate(f"{key}:entered").wait(), timeout=10)


async def children(store: Store, parent: uuid.UUID, n: int) -> list[Execution]:
    async def check() -> list[Execution] | None:
        found, _ = await store.execution_children(parent)
        return found if len(found) >= n else None

    got: list[Execution] = await until(check, what=f"{n} children of {parent}")
    return got


def uid(body: dict[str, Any]) -> uuid.UUID:
    return uuid.UUID(body["id"])


TERMINAL_KINDS = {str(s) for s in TERMINAL}


# -- cancel ------------------------------------------------------------------------------------


async def test_cancel_of_a_non_cancellable_is_refused_with_a_hint_to_pause(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    pending = await api_submit(client, "test:echo/run.fn", 1, scheduled_at=later())
    blocked = await api_submit(client, "test:recv/run.fn", "t")
    await wait_status(store, uid(blocked), Status.BLOCKED)
    paused = await api_submit(client, "test:echo/run.fn", 2, paused=True)
    for body, state in ((pending, "pending"), (blocked, "blocked"), (paused, "paused")):
        before = await history(store, uid(body))
        response = await client.put(f"/v1/executions/{body['id']}/cancel")
        assert response.status_code == 409, response.text
        error = error_of(response)
        assert error["code"] == "not_cancellable"
        assert error["state"] == state
        assert "-cancellable" in error["message"]
        assert "Pause it instead" in error["message"]
        assert f"/v1/executions/{body['id']}/pause" in error["message"]
        assert await history(store, uid(body)) == before
        assert (await get(store, uid(body))).status == state


async def test_cancel_of_a_running_non_cancellable_is_refused_and_it_runs_on(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    key = "plain"
    body = await api_submit(client, "engc:gatedplain/run.fn", key)
    await entered(key)
    response = await client.put(f"/v1/executions/{body['id']}/cancel")
    assert response.status_code == 409
    assert error_of(response)["state"] == "running"
    assert error_of(response)["code"] == "not_cancellable"
    ex = await get(store, uid(body))
    assert ex.cancel_requested_at is None
    gate(key).set()
    done = await wait_status(store, uid(body), Status.COMPLETED)
    assert done.result == [key, f"{key}:after"]
    assert "cancel_requested" not in await kinds(store, uid(body))


async def test_cancel_of_a_pending_cancellable_is_at_once(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:waiter/wait.run-cancellable", "t",
                            scheduled_at=later())
    out = await control(client, body["id"], "cancel")
    assert out["status"] == "cancelled"
    assert out["cancel_requested_at"] is not None and out["result"] is None
    evs = await history(store, uid(body))
    assert [e.kind for e in evs] == ["pending", "cancel_requested", "cancelled"]
    assert evs[2].data["reason"] == "cancelled on request"
    # the cancelled execution and its history remain, listed under its status
    got = await client.get(f"/v1/executions/{body['id']}")
    assert got.status_code == 200 and got.json()["status"] == "cancelled"
    listed = await client.get("/v1/executions", params={"status": "cancelled"})
    assert [i["id"] for i in listed.json()["items"]] == [body["id"]]
    hist = await client.get(f"/v1/executions/{body['id']}/history")
    assert [i["kind"] for i in hist.json()["items"]] == [
        "pending", "cancel_requested", "cancelled"]


async def test_cancel_of_a_blocked_cancellable_is_at_once(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:waiter/wait.run-cancellable", "t")
    await wait_status(store, uid(body), Status.BLOCKED)
    out = await control(client, body["id"], "cancel")
    assert out["status"] == "cancelled" and out["lease_owner"] is None
    ks = await kinds(store, uid(body))
    assert ks[-2:] == ["cancel_requested", "cancelled"]
    assert ks[:4] == ["pending", "running", RECV_STARTED, "blocked"]
    # a message to it now is refused with its state; nothing runs it again
    response = await client.post(f"/v1/executions/{body['id']}/messages",
                                 json={"topic": "t", "payload": 1})
    assert response.status_code == 409
    assert error_of(response)["state"] == "cancelled"
    await asyncio.sleep(0.15)
    assert await kinds(store, uid(body)) == ks


async def test_cancel_of_a_paused_cancellable_is_at_once(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:waiter/wait.run-cancellable", "t", paused=True)
    assert body["status"] == "paused"
    out = await control(client, body["id"], "cancel")
    assert out["status"] == "cancelled"
    assert await kinds(store, uid(body)) == ["paused", "cancel_requested", "cancelled"]


async def test_cancel_of_a_running_one_stops_it_at_its_next_await(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    """Deterministic: the cancel arrives while a step runs; that step's result is kept, the
    next step never starts, and the execution is recorded cancelled."""
    key = "run"
    body = await api_submit(client, "engc:gated/run.fn-cancellable", key, False)
    ident = uid(body)
    await entered(key)
    out = await control(client, ident, "cancel")
    assert out["status"] == "running" and out["cancel_requested_at"] is not None
    await interrupted(live, ident, "cancel")  # by NOTIFY or by the heartbeat
    gate(key).set()
    done = await wait_status(store, ident, Status.CANCELLED)
    assert done.result is None and done.lease_owner is None
    assert CALLS == {f"{key}:before": 1, key: 1}  # the step after the cancel never ran
    evs = await history(store, ident)
    ks = [e.kind for e in evs]
    assert ks == ["pending", "running", STEP_COMPLETED, "cancel_requested", STEP_COMPLETED,
                  "cancelled"]
    assert evs[4].data["pos"] == 1 and evs[4].data["result"] == key
    assert evs[5].data["reason"] == "cancel requested; stopped at its next await"
    assert evs[5].data["owner"] == live.id
    # cancelling again, or a cancelled one: 200, nothing changes
    again = await control(client, ident, "cancel")
    assert again["status"] == "cancelled"
    assert await kinds(store, ident) == ks


async def test_cancel_of_a_running_ticker_is_recorded_cancelled(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:ticker/tick.run-cancellable", 40)
    ident = uid(body)
    await wait_kind(store, ident, STEP_COMPLETED, count=3)
    out = await control(client, ident, "cancel")
    assert out["status"] == "running"
    done = await wait_status(store, ident, Status.CANCELLED, Status.COMPLETED)
    assert done.status == Status.CANCELLED and done.result is None
    evs = await history(store, ident)
    ks = [e.kind for e in evs]
    assert ks.count("cancel_requested") == 1 and ks[-1] == "cancelled"
    assert ks.index("cancel_requested") < ks.index("cancelled")
    steps = [e.data["pos"] for e in evs if e.kind == STEP_COMPLETED]
    assert steps == list(range(len(steps))) and len(steps) < 40
    after = ks[ks.index("cancel_requested"):].count(STEP_COMPLETED)
    # The steps after the request are the one in flight plus those that ran before the
    # worker was told: by NOTIFY (PostgreSQL) or at the latest by the next heartbeat.
    limit = 2 + int(SETTINGS.effective_heartbeat_interval / 0.05)
    assert after <= limit, ks
    assert [k for k in ks if k in TERMINAL_KINDS] == ["cancelled"]


async def test_cancelling_terminal_executions_or_twice_changes_nothing(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    waiter = await api_submit(client, "test:waiter/wait.run-cancellable", "t")
    await wait_status(store, uid(waiter), Status.BLOCKED)
    await message(client, waiter["id"], "t", "bye")
    await wait_status(store, uid(waiter), Status.COMPLETED)
    echo = await api_submit(client, "test:echo/run.fn", 1)  # not cancellable, but terminal
    await wait_status(store, uid(echo), Status.COMPLETED)
    cancelled = await api_submit(client, "test:waiter/wait.run-cancellable", "t",
                                 scheduled_at=later())
    await control(client, cancelled["id"], "cancel")
    for body, state in ((waiter, "completed"), (echo, "completed"), (cancelled, "cancelled")):
        before = await history(store, uid(body))
        row = await get(store, uid(body))
        for _ in range(2):
            out = await control(client, body["id"], "cancel")
            assert out["status"] == state
        assert await history(store, uid(body)) == before
        assert await get(store, uid(body)) == row


async def test_cancel_twice_while_running_records_one_request(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    key = "twice"
    body = await api_submit(client, "engc:gated/run.fn-cancellable", key, False)
    await entered(key)
    first = await control(client, body["id"], "cancel")
    size = len(await history(store, uid(body)))
    second = await control(client, body["id"], "cancel")
    assert first["cancel_requested_at"] == second["cancel_requested_at"]
    assert second["status"] == "running"
    assert len(await history(store, uid(body))) == size
    await interrupted(live, uid(body), "cancel")
    gate(key).set()
    await wait_status(store, uid(body), Status.CANCELLED)
    assert (await kinds(store, uid(body))).count("cancel_requested") == 1


async def test_recursive_cancellation_three_levels_with_a_non_cancellable_middle(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    top = await api_submit(client, "test:top/top.run-cancellable", "leaf")
    top_id = uid(top)
    kids = await children(store, top_id, 2)
    (mid,) = [k for k in kids if k.ffqn == "test:mid/run.fn"]
    (direct,) = [k for k in kids if k.ffqn == "test:waiter/wait.run-cancellable"]
    (leaf,) = await children(store, mid.id, 1)
    assert leaf.ffqn == "test:waiter/wait.run-cancellable" and leaf.params == ["leaf"]
    for ident in (direct.id, leaf.id, mid.id, top_id):
        await wait_status(store, ident, Status.BLOCKED)

    out = await control(client, top_id, "cancel")
    # the top waits for its non-cancellable child: not cancelled yet, and says so
    assert out["status"] == "blocked" and out["cancel_requested_at"] is not None
    assert (await get(store, direct.id)).status == Status.CANCELLED
    mid_row = await get(store, mid.id)
    leaf_row = await get(store, leaf.id)
    assert mid_row.status == Status.BLOCKED and mid_row.cancel_requested_at is None
    assert leaf_row.status == Status.BLOCKED and leaf_row.cancel_requested_at is None
    assert "cancel_requested" not in await kinds(store, mid.id)
    assert "cancel_requested" not in await kinds(store, leaf.id)
    assert (await kinds(store, direct.id))[-2:] == ["cancel_requested", "cancelled"]
    (why,) = await events(store, direct.id, "cancelled")
    assert why.data["reason"] == "cancelled with its parent"
    await asyncio.sleep(0.2)  # a few poll cycles: nothing moves by itself
    assert (await get(store, top_id)).status == Status.BLOCKED
    assert (await get(store, mid.id)).status == Status.BLOCKED

    # release the leaf: it completes, mid completes with its result, the top is cancelled
    await message(client, leaf.id, "leaf", "leaf done")
    done_leaf = await wait_status(store, leaf.id, Status.COMPLETED)
    done_mid = await wait_status(store, mid.id, Status.COMPLETED)
    done_top = await wait_status(store, top_id, Status.CANCELLED)
    assert done_leaf.result == "leaf done" and done_mid.result == "leaf done"
    assert done_top.result is None
    top_kinds = await kinds(store, top_id)
    assert top_kinds[-2:] == ["cancel_requested", "cancelled"]
    assert top_kinds.count("running") == 1  # the top never ran again after the cancel
    (final,) = await events(store, top_id, "cancelled")
    assert final.data["child_id"] == str(mid.id)
    assert final.at >= done_mid.updated_at
    # history kept for all four
    for ex_id in (top_id, mid.id, direct.id, leaf.id):
        assert (await kinds(store, ex_id))[0] == "pending"


async def test_cancel_racing_completion_ends_in_exactly_one_terminal_state(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    outcomes: list[tuple[str, str]] = []
    for attempt in range(6):
        n = 3
        body = await api_submit(client, "test:ticker/tick.run-cancellable", n)
        ident = uid(body)
        # cancel at a different point of the run each time, the last ones right at its end
        await wait_kind(store, ident, STEP_COMPLETED, count=min(1 + attempt // 2, n))
        out = await control(client, ident, "cancel")
        done = await wait_status(store, ident, *TERMINAL)
        evs = await history(store, ident)
        ks = [e.kind for e in evs]
        assert [k for k in ks if k in TERMINAL_KINDS] == [str(done.status)], ks
        if out["status"] == "completed":  # the cancel came after the end: nothing recorded
            assert "cancel_requested" not in ks and "late_report" not in ks
        else:
            assert out["status"] == "running"
            assert ks.count("cancel_requested") == 1
        if done.status == Status.COMPLETED:
            assert done.result == sum(range(n))
            if "cancel_requested" in ks:
                (late,) = [e for e in evs if e.kind == "late_report"]
                assert late.data["report"] == "cancel"
                assert "before the cancellation reached it" in late.data["reason"]
                assert ks.index("completed") < ks.index("late_report")
        else:
            assert done.status == Status.CANCELLED and done.result is None
            assert "late_report" not in ks
        outcomes.append((out["status"], str(done.status)))
    # the race was run: at least one cancel was requested while it still ran
    assert any(requested == "running" for requested, _ in outcomes), outcomes


async def test_cancel_that_loses_to_completion_is_kept_as_a_late_report(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    """Deterministic: the cancel reaches the worker while the last step runs; after it the
    workflow returns without another await, so completion wins."""
    key = "last"
    body = await api_submit(client, "engc:gated/run.fn-cancellable", key, True)
    ident = uid(body)
    await entered(key)
    await control(client, ident, "cancel")
    await interrupted(live, ident, "cancel")
    gate(key).set()
    done = await wait_status(store, ident, *TERMINAL)
    assert done.status == Status.COMPLETED and done.result == [f"{key}:before", key]
    evs = await history(store, ident)
    ks = [e.kind for e in evs]
    assert ks[-2:] == ["completed", "late_report"]
    assert evs[-1].data["report"] == "cancel"
    # and it stays completed: cancelling again answers 200 and changes nothing
    assert (await control(client, ident, "cancel"))["status"] == "completed"
    assert await kinds(store, ident) == ks


async def test_cancel_requested_before_a_durable_wait_ends_it_at_that_wait(
    client: httpx.AsyncClient, store: Store
) -> None:
    """The cancel is requested while a step runs and has not reached the worker yet (no
    notification, a slow heartbeat) when the workflow enters a long sleep: that sleep is
    its next await, so it must end there cancelled, not sleep on for a minute."""
    slow = WorkerSettings(lease_ttl=3, heartbeat_interval=2.5, poll_interval=0.05,
                          concurrency=8, shutdown_grace=1, notifications=False)
    worker = make_worker(store, app, slow)
    async with running(worker):
        key = "wait"
        body = await api_submit(client, "engc:thenwait/run.fn-cancellable", key, "sleep")
        ident = uid(body)
        await entered(key)
        await control(client, ident, "cancel")
        gate(key).set()
        await wait_kind(store, ident, SLEEP_STARTED)
        await asyncio.sleep(0.5)
        ex = await get(store, ident)
        assert ex.status == Status.CANCELLED, (
            f"cancel requested before the sleep; the execution is {ex.status} "
            f"(wake_at {ex.wake_at}): {await kinds(store, ident)}")


async def test_pause_requested_before_a_durable_wait_parks_it_at_that_wait(
    client: httpx.AsyncClient, store: Store
) -> None:
    """Pause requested while a step runs, not yet seen by the worker, then the workflow
    waits for a message: it must be paused (returning to blocked when unpaused), not blocked
    with the pause forgotten until it happens to run again."""
    slow = WorkerSettings(lease_ttl=3, heartbeat_interval=2.5, poll_interval=0.05,
                          concurrency=8, shutdown_grace=1, notifications=False)
    worker = make_worker(store, app, slow)
    async with running(worker):
        key = "pausewait"
        body = await api_submit(client, "engc:thenwait/run.fn-cancellable", key, "recv")
        ident = uid(body)
        await entered(key)
        out = await control(client, ident, "pause")
        assert out["status"] == "running" and out["pause_requested_at"] is not None
        gate(key).set()
        await wait_kind(store, ident, RECV_STARTED)
        await asyncio.sleep(0.3)
        ex = await get(store, ident)
        assert ex.status == Status.PAUSED, (
            f"pause requested before the receive; the execution is {ex.status}: "
            f"{await kinds(store, ident)}")


async def test_a_cancel_requested_parent_woken_by_its_timer_runs_no_more_steps(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    """Cancelled while sleeping, with a non-cancellable child still running: the parent
    waits for the child, but must not run its code again when its timer fires."""
    key = "keeps"
    body = await api_submit(client, "engc:keeps/run.fn-cancellable", key, "c")
    ident = uid(body)
    (child,) = await children(store, ident, 1)
    blocked = await wait_status(store, ident, Status.BLOCKED)
    assert blocked.wake_at is not None
    out = await control(client, ident, "cancel")
    assert out["status"] == "blocked"
    await asyncio.sleep(0.6)  # past the parent's wake time
    assert CALLS.get(f"{key}:after-sleep", 0) == 0, (
        f"a step ran after the cancel: {await kinds(store, ident)}")
    await message(client, child.id, "c", "child done")
    await wait_status(store, child.id, Status.COMPLETED)
    done = await wait_status(store, ident, *TERMINAL)
    assert done.status == Status.CANCELLED
    ks = await kinds(store, ident)
    assert STEP_COMPLETED not in ks[ks.index("cancel_requested"):]


async def test_unpausing_a_parent_that_waits_to_be_cancelled_does_not_run_it_again(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    """The top of the three-level tree, cancel requested and waiting for its
    non-cancellable child, is paused and unpaused: it still only waits for that child (it
    returns to blocked); it must not be claimed and replayed."""
    top = await api_submit(client, "test:top/top.run-cancellable", "leaf")
    top_id = uid(top)
    kids = await children(store, top_id, 2)
    (mid,) = [k for k in kids if k.ffqn == "test:mid/run.fn"]
    (leaf,) = await children(store, mid.id, 1)
    for ident in (*(k.id for k in kids), leaf.id, top_id):
        await wait_status(store, ident, Status.BLOCKED)
    assert (await control(client, top_id, "cancel"))["status"] == "blocked"
    assert (await control(client, top_id, "pause"))["status"] == "paused"
    out = await control(client, top_id, "unpause")
    await asyncio.sleep(0.3)
    ks = await kinds(store, top_id)
    assert ks.count("running") == 1, (
        f"unpause answered {out['status']}; the cancel-requested top ran again: {ks}")
    assert out["status"] == "blocked"
    await message(client, leaf.id, "leaf", "done")
    assert (await wait_status(store, top_id, *TERMINAL)).status == Status.CANCELLED


# -- pause and unpause -------------------------------------------------------------------------


async def test_pause_and_unpause_a_pending_execution(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:echo/run.fn", "p", scheduled_at=later(0.5))
    ident = uid(body)
    out = await control(client, ident, "pause")
    assert out["status"] == "paused"
    row = await get(store, ident)
    assert row.paused_from == "pending"
    evs = await history(store, ident)
    assert [e.kind for e in evs] == ["pending", "paused"]
    assert evs[1].data["from"] == "pending"
    # pausing a paused execution: 200, unchanged
    again = await control(client, ident, "pause")
    assert again["status"] == "paused"
    assert await history(store, ident) == evs and await get(store, ident) == row
    # past its scheduled time, still not claimed: paused executions are never claimed
    await asyncio.sleep(0.7)
    assert (await get(store, ident)).status == Status.PAUSED
    assert ident not in live.runs
    out = await control(client, ident, "unpause")
    assert out["status"] == "pending"
    done = await wait_status(store, ident, Status.COMPLETED)
    assert done.result == "p"
    assert await kinds(store, ident) == ["pending", "paused", "pending", "running",
                                         "completed"]


async def test_submitted_paused_is_listed_not_claimed_and_runs_when_unpaused(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:echo/run.fn", "held", paused=True)
    ident = uid(body)
    assert body["status"] == "paused" and body["lease_owner"] is None
    await asyncio.sleep(0.2)
    row = await get(store, ident)
    assert row.status == Status.PAUSED and row.lease_epoch == 0
    assert await kinds(store, ident) == ["paused"]
    listed = await client.get("/v1/executions", params={"status": "paused"})
    assert listed.status_code == 200
    assert [i["id"] for i in listed.json()["items"]] == [body["id"]]
    assert (await client.get(f"/v1/executions/{ident}")).json()["status"] == "paused"
    out = await control(client, ident, "unpause")
    assert out["status"] == "pending"
    done = await wait_status(store, ident, Status.COMPLETED)
    assert done.result == "held"
    listed = await client.get("/v1/executions", params={"status": "paused"})
    assert listed.json()["items"] == []


async def test_pause_and_unpause_a_blocked_execution(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:recv/run.fn", "m")
    ident = uid(body)
    await wait_status(store, ident, Status.BLOCKED)
    out = await control(client, ident, "pause")
    assert out["status"] == "paused"
    assert (await get(store, ident)).paused_from == "blocked"
    # nothing arrived: unpause returns it to blocked (no worker, no lease)
    out = await control(client, ident, "unpause")
    assert out["status"] == "blocked" and out["lease_owner"] is None
    # pause again; a message arrives meanwhile: it stays paused, and is not claimed
    await control(client, ident, "pause")
    sent = await message(client, ident, "m", {"v": 1})
    assert sent["topic"] == "m"
    await asyncio.sleep(0.2)
    row = await get(store, ident)
    assert row.status == Status.PAUSED and ident not in live.runs
    listed = await client.get("/v1/executions", params={"status": "paused"})
    assert [i["id"] for i in listed.json()["items"]] == [body["id"]]
    # unpause: it has something to do now, so pending; it runs and gets the message
    out = await control(client, ident, "unpause")
    assert out["status"] == "pending"
    done = await wait_status(store, ident, Status.COMPLETED)
    assert done.result == {"v": 1}
    ks = await kinds(store, ident)
    assert ks[:4] == ["pending", "running", RECV_STARTED, "blocked"]
    assert ks[4:9] == ["paused", "blocked", "paused", "message_arrived", "pending"]
    assert ks[-3:] == ["running", "message_received", "completed"]


async def test_a_sleep_that_ends_while_paused_is_pending_when_unpaused(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    body = await api_submit(client, "test:sleep/run.fn", 0.3)
    ident = uid(body)
    blocked = await wait_status(store, ident, Status.BLOCKED)
    await control(client, ident, "pause")
    await asyncio.sleep(0.5)  # the timer is due, but a paused execution is not woken
    row = await get(store, ident)
    assert row.status == Status.PAUSED
    assert blocked.wake_at is not None and row.updated_at < blocked.wake_at
    out = await control(client, ident, "unpause")
    assert out["status"] == "pending"
    done = await wait_status(store, ident, Status.COMPLETED)
    assert done.result.startswith("slept since ")


async def test_pause_a_running_execution_parks_it_and_unpause_resumes_it(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    n = 16
    body = await api_submit(client, "test:ticker/tick.run", n)  # not cancellable
    ident = uid(body)
    await wait_kind(store, ident, STEP_COMPLETED, count=2)
    out = await control(client, ident, "pause")
    assert out["status"] == "running" and out["pause_requested_at"] is not None
    parked = await wait_status(store, ident, Status.PAUSED)
    assert parked.lease_owner is None and parked.lease_expires_at is None
    assert parked.pause_requested_at is None
    await until(lambda: _not_in(live, ident), what="the worker to let go")
    evs = await history(store, ident)
    done_before = [e.data["pos"] for e in evs if e.kind == STEP_COMPLETED]
    assert done_before == list(range(len(done_before))) and len(done_before) < n
    (park,) = [e for e in evs if e.kind == "paused"]
    assert park.data["reason"] == "pause requested; parked at a step boundary"
    assert park.data["owner"] == live.id
    # paused again: 200 unchanged; it stays parked and listed, no step runs
    again = await control(client, ident, "pause")
    assert again["status"] == "paused"
    await asyncio.sleep(0.2)
    assert await history(store, ident) == evs
    listed = await client.get("/v1/executions", params={"status": "paused"})
    assert [i["id"] for i in listed.json()["items"]] == [body["id"]]

    out = await control(client, ident, "unpause")
    assert out["status"] == "pending"
    done = await wait_status(store, ident, Status.COMPLETED)
    assert done.result == sum(range(n))
    after = await history(store, ident)
    # resumed from its checkpoints: every step position once, none re-run
    assert [e.data["pos"] for e in after if e.kind == STEP_COMPLETED] == list(range(n))
    ks = [e.kind for e in after]
    assert ks.count("running") == 2 and ks.count("paused") == 1
    assert ks[ks.index("paused") + 1] == "pending"


async def _not_in(worker: Worker, ident: uuid.UUID) -> bool:
    return ident not in worker.runs


async def test_unpause_before_the_running_execution_parks_withdraws_the_pause(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    """Pause then unpause while the worker is inside a step: the unpause answers 200 with
    the execution running and the pause withdrawn, so the execution must run on to its
    end, not park anyway."""
    key = "withdraw"
    body = await api_submit(client, "engc:gatedplain/run.fn", key)
    ident = uid(body)
    await entered(key)
    await control(client, ident, "pause")
    await interrupted(live, ident, "pause")
    out = await control(client, ident, "unpause")
    assert out["status"] == "running" and out["pause_requested_at"] is None
    assert (await kinds(store, ident))[-2:] == ["pause_requested", "pause_withdrawn"]
    gate(key).set()
    ex = await wait_status(store, ident, *TERMINAL, Status.PAUSED, timeout=5)
    assert ex.status == Status.COMPLETED, (
        f"unpause withdrew the pause (answered running) but the execution is {ex.status}: "
        f"{await kinds(store, ident)}")


async def test_unpause_and_pause_answer_409_in_the_wrong_state(
    client: httpx.AsyncClient, store: Store, live: Worker
) -> None:
    done = await api_submit(client, "test:echo/run.fn", 1)
    await wait_status(store, uid(done), Status.COMPLETED)
    blocked = await api_submit(client, "test:recv/run.fn", "x")
    await wait_status(store, uid(blocked), Status.BLOCKED)
    for body, action, state in ((done, "pause", "completed"), (done, "unpause", "completed"),
                                (blocked, "unpause", "blocked")):
        before = await history(store, uid(body))
        response = await client.put(f"/v1/executions/{body['id']}/{action}")
        assert response.status_code == 409, response.text
        error = error_of(response)
        assert error["state"] == state and error["code"] == "wrong_state"
        assert state in error["message"]
        assert await history(store, uid(body)) == before
