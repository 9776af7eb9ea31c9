"""A finished run must consume its whole recorded history: a workflow that returns (or
raises its own error) while its history still holds calls the replay never reached fails
with error code ``nondeterminism``, naming those calls (docs/workflows.md, "Time and other
sources of nondeterminism").

Unit tests of :meth:`Context.finish` against synthetic histories (which recorded events
are calls, and which are not), and end to end with a worker on both backends: a workflow
whose code drops calls after a restart, whose code then raises, and one stopped by its
timeout before the end of its history (a timeout, not a nondeterminism).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests._helpers import store_fixture
from tests.durable._support import history, make_worker, running, submit, wait_kind, wait_status
from veracity import App, Context, NondeterminismError
from veracity.core.states import Status
from veracity.models import Claim, HistoryEvent
from veracity.store import Store
from veracity.worker.context import (
    CHILD_SUBMITTED,
    JOIN_NEXT,
    MESSAGE_RECEIVED,
    NOW_RECORDED,
    RECV_STARTED,
    SCHEDULED,
    SLEEP_STARTED,
    STEP_COMPLETED,
    STEP_FAILED,
    Journal,
    step_name,
)

EXECUTION = uuid.UUID("00000000-0000-7000-8000-0000000000a1")
CHILD = uuid.UUID("00000000-0000-7000-8000-0000000000a2")
T0 = datetime(2030, 1, 1, tzinfo=UTC)
PAST = (T0 + timedelta(seconds=1)).isoformat()


class NoStore:
    """A store that must not be used: these replays decide from the journal alone."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the replay touched the store ({name})")


def ev(seq: int, kind: str, **data: Any) -> HistoryEvent:
    return HistoryEvent(EXECUTION, seq, kind, T0 + timedelta(seconds=seq), data)


def context(*events: HistoryEvent) -> Context:
    return Context(
        store=NoStore(),
        claim=Claim(EXECUTION, "w", 2),
        execution_id=EXECUTION,
        deployment_id="d-unit",
        attempt=2,
        journal=Journal.from_history(list(events)),
        clock_base=T0 + timedelta(hours=1),
    )


def charge(order: str) -> str:
    return f"charged {order}"


def refund(order: str) -> str:
    return f"refunded {order}"


CHARGE = step_name(charge)
REFUND = step_name(refund)


def recorded_run() -> list[HistoryEvent]:
    """A run that made six calls, with events that are not calls between them."""
    return [
        ev(1, "pending", ffqn="t:u/run.fn", params=["o-1"]),
        ev(2, "running", owner="w", epoch=1, attempt=1),
        ev(3, STEP_COMPLETED, pos=0, name=CHARGE, attempts=1, result="charged o-1"),
        ev(4, NOW_RECORDED, pos=1, value=PAST),
        ev(5, STEP_FAILED, pos=2, name=REFUND, attempts=3,
           error={"type": "KeyError", "message": "'k'"}),
        ev(6, SLEEP_STARTED, pos=3, until=PAST, seconds=60),
        ev(7, "blocked", reason="sleep"),
        ev(8, "message_arrived", topic="approval", message_id=1),
        ev(9, "pending", reason="timer"),
        ev(10, "running", owner="w", epoch=2, attempt=1),
        ev(11, RECV_STARTED, pos=4, topic="approval", deadline=None),
        ev(12, MESSAGE_RECEIVED, pos=4, topic="approval", message_id=1, payload="ok"),
        ev(13, CHILD_SUBMITTED, pos=5, child_id=str(CHILD), ffqn="t:c/run.fn", params=[1],
           join_set="js0"),
        ev(14, "cancel_requested", by="cli"),
        ev(15, "late_report", report="checkpoint", payload={"pos": 9}),
    ]


async def test_a_run_that_makes_every_recorded_call_finishes_consistent() -> None:
    ctx = context(*recorded_run())
    assert await ctx.step(charge, "o-1") == "charged o-1"
    ctx.now()
    with pytest.raises(Exception, match="KeyError"):
        await ctx.step(refund, "o-1")
    await ctx.sleep(60)
    assert await ctx.recv("approval") == "ok"
    assert await ctx.join_set().submit("t:c/run.fn", 1) == CHILD
    # message_arrived, cancel_requested, late_report (even one whose payload names a
    # position) and the state events are not calls: nothing is left over
    assert ctx.finish() is None and ctx.nondeterminism is None


async def test_calls_left_in_the_history_are_named_in_order() -> None:
    ctx = context(*recorded_run())
    assert await ctx.step(charge, "o-1") == "charged o-1"
    ctx.now()
    err = ctx.finish()
    assert isinstance(err, NondeterminismError)
    assert ctx.nondeterminism is err
    assert err.position == 2
    assert err.unreached == ((2, f"step {REFUND}"), (3, "sleep(60s)"),
                             (4, "recv('approval')"), (5, "submit t:c/run.fn(1)"))
    assert str(err) == (
        "the workflow finished but its history holds calls this code never made: "
        f"step {REFUND} at position 2, sleep(60s) at position 3, recv('approval') at "
        "position 4, submit t:c/run.fn(1) at position 5")
    assert ctx.finish() is err  # asked again: the same, first divergence


async def test_a_run_that_makes_no_call_leaves_every_recorded_call() -> None:
    ctx = context(
        ev(1, "pending"),
        ev(3, SCHEDULED, pos=0, execution_id=str(CHILD), ffqn="t:s/run.fn", params=[]),
        ev(4, JOIN_NEXT, pos=1, join_set="js0", child_id=str(CHILD), ffqn="t:c/run.fn",
           status="completed", result=1, error=None),
    )
    err = ctx.finish()
    assert err is not None and err.position == 0
    assert err.unreached == ((0, "schedule t:s/run.fn()"), (1, "next() of join set js0"))


async def test_a_history_with_no_call_leaves_nothing() -> None:
    ctx = context(ev(1, "pending"), ev(2, "running"), ev(3, "cancel_requested"))
    assert ctx.finish() is None


async def test_a_divergence_met_earlier_stays_the_one_reported() -> None:
    ctx = context(*recorded_run())
    with pytest.raises(NondeterminismError) as info:
        await ctx.step(refund, "o-1")
    assert ctx.finish() is info.value and info.value.unreached == ()


async def test_a_long_list_of_calls_left_is_cut_in_the_message() -> None:
    events = [ev(3 + i, STEP_COMPLETED, pos=i, name=CHARGE, attempts=1, result=i)
              for i in range(14)]
    ctx = context(*events)
    err = ctx.finish()
    assert err is not None and len(err.unreached) == 14
    assert str(err).endswith(f"step {CHARGE} at position 9, and 4 more")
    assert "position 10" not in str(err)


# -- end to end, with a worker ---------------------------------------------------------------


store = store_fixture(pool_size=4)


shrinking = App("unreached")


def _charge(order: str) -> str:
    return f"charged {order}"


def _ship(order: str) -> str:
    return f"shipped {order}"


@shrinking.workflow("unr:orders/run.fn")
async def order(ctx: Context, flag: str, order_id: str) -> str:
    """After a restart with ``flag`` present, the code no longer makes its last calls."""
    await ctx.step(_charge, order_id)
    if Path(flag).exists():
        return "done early"
    await ctx.sleep(0.2)
    await ctx.step(_ship, order_id)
    return "done"


@shrinking.workflow("unr:orders/raise.fn")
async def order_raises(ctx: Context, flag: str, order_id: str) -> str:
    """After a restart with ``flag`` present, the code raises before its last calls."""
    await ctx.step(_charge, order_id)
    if Path(flag).exists():
        raise ValueError("no longer ships")
    await ctx.sleep(0.2)
    return "done"


@shrinking.workflow("unr:orders/slow.fn", timeout=1.0)
async def order_slow(ctx: Context, flag: str, order_id: str) -> str:
    """After a restart with ``flag`` present, the body outlives its timeout before it
    reaches its recorded calls. (The timeout leaves the first run, a step and the start of
    a sleep, a wide margin on a loaded machine: at 0.3 s it once ran out before the sleep
    under a full test run beside other work.)"""
    if Path(flag).exists():
        await asyncio.sleep(3)
    await ctx.step(_charge, order_id)
    await ctx.sleep(0.2)
    return "done"


async def run_then_change(store: Store, ffqn: str, tmp_path: Path) -> tuple[Any, list[str]]:
    flag = tmp_path / "flag"
    worker = make_worker(store, shrinking)
    async with running(worker):
        ex = await submit(store, ffqn, str(flag), "o-1")
        await wait_kind(store, ex.id, "blocked")  # in its durable sleep
        flag.touch()  # the code now takes another path
        done = await wait_status(store, ex.id, Status.FAILED, Status.COMPLETED)
    return done, [e.kind for e in await history(store, ex.id)]


async def test_a_workflow_that_returns_before_its_recorded_calls_fails(
    store: Store, tmp_path: Path
) -> None:
    done, kinds = await run_then_change(store, "unr:orders/run.fn", tmp_path)
    assert done.status == Status.FAILED, done.result
    assert done.error["code"] == "nondeterminism"
    assert done.error["type"] == "NondeterminismError"
    assert done.error["message"] == (
        "the workflow finished but its history holds calls this code never made: "
        "sleep(0.2s) at position 1")
    assert kinds[-1] == "failed" and "completed" not in kinds


async def test_a_workflow_that_raises_before_its_recorded_calls_fails_nondeterministic(
    store: Store, tmp_path: Path
) -> None:
    done, _ = await run_then_change(store, "unr:orders/raise.fn", tmp_path)
    assert done.status == Status.FAILED
    assert done.error["code"] == "nondeterminism", done.error
    assert "sleep(0.2s) at position 1" in done.error["message"]


async def test_a_timeout_before_the_end_of_the_history_is_a_timeout(
    store: Store, tmp_path: Path
) -> None:
    done, _ = await run_then_change(store, "unr:orders/slow.fn", tmp_path)
    assert done.status == Status.FAILED
    assert done.error["code"] == "timeout", done.error


async def test_an_unchanged_workflow_completes_after_its_replay(
    store: Store, tmp_path: Path
) -> None:
    worker = make_worker(store, shrinking)
    async with running(worker):
        ex = await submit(store, "unr:orders/run.fn", str(tmp_path / "absent"), "o-2")
        done = await wait_status(store, ex.id, Status.FAILED, Status.COMPLETED)
    assert done.status == Status.COMPLETED, done.error
    kinds = [e.kind for e in await history(store, ex.id)]
    assert kinds.count("running") == 2  # replayed once, after its sleep
