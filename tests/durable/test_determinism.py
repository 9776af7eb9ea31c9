"""Determinism: a replay that makes a different call than the one recorded at a position
fails the execution with error code ``nondeterminism``, naming both calls.

End to end with a worker (test:changing/run.fn, whose code takes another path once a flag
file exists), and as pure unit tests of the Context's replay against synthetic histories,
for each kind of mismatch.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests import workflows
from tests.durable._support import (
    history,
    kinds,
    make_worker,
    running,
    submit,
    wait_kind,
    wait_status,
)
from veracity import App, Context, NondeterminismError, StepFailed
from veracity.core.states import Status
from veracity.models import Claim, HistoryEvent
from veracity.store import Store
from veracity.worker.context import (
    CHILD_SUBMITTED,
    JOIN_NEXT,
    MESSAGE_RECEIVED,
    NOW_RECORDED,
    RECV_STARTED,
    RECV_TIMED_OUT,
    SCHEDULED,
    SLEEP_STARTED,
    STEP_COMPLETED,
    STEP_FAILED,
    Journal,
    args_digest,
    step_name,
)

# -- end to end ------------------------------------------------------------------------------


async def test_a_replay_that_hits_changed_code_fails_with_nondeterminism(
    store: Store, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    worker = make_worker(store, workflows.app)
    async with running(worker):
        ex = await submit(store, "test:changing/run.fn", str(flag))
        await wait_kind(store, ex.id, "blocked")  # in its 0.3 s sleep, after the first step
        flag.touch()  # the code now takes the other branch: a different step at position 0
        done = await wait_status(store, ex.id, Status.FAILED, Status.COMPLETED)

    assert done.status == Status.FAILED, done.result
    error = done.error
    assert error["code"] == "nondeterminism"
    assert error["type"] == "NondeterminismError"
    recorded = f"step {step_name(workflows._read_flag)}"
    new = f"step {step_name(workflows._blocking_sleep_then_mark)}"
    assert recorded == "step tests.workflows._read_flag"
    assert recorded in error["message"] and new in error["message"]
    assert error["message"].index(recorded) < error["message"].index(new)
    assert "position 0" in error["message"]
    # the new step never ran, and nothing was journalled for it
    assert not Path(str(flag) + ".marks").exists()
    evs = await history(store, ex.id)
    assert [e.kind for e in evs] == [
        "pending", "running", STEP_COMPLETED, SLEEP_STARTED, "blocked", "pending", "running",
        "failed"]
    assert evs[2].data["name"] == "tests.workflows._read_flag"
    assert evs[2].data["result"] is False
    assert evs[-1].data["error"] == error and evs[-1].data["owner"] == worker.id


# A workflow that handles its steps' failures with a broad except: a nondeterminism on
# replay must still fail the execution, not be swallowed by workflow code.
swallowing = App("engine-determinism")


def _first() -> str:
    return "first"


def _second() -> str:
    return "second"


@swallowing.workflow("engd:swallow/run.fn")
async def swallow(ctx: Context, flag: str) -> str:
    try:
        if Path(flag).exists():
            await ctx.step(_second)
        else:
            await ctx.step(_first)
    except Exception:  # e.g. to carry on after a StepFailed
        pass
    await ctx.sleep(0.2)
    return "done"


async def test_workflow_code_cannot_swallow_a_nondeterminism(
    store: Store, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    worker = make_worker(store, swallowing)
    async with running(worker):
        ex = await submit(store, "engd:swallow/run.fn", str(flag))
        await wait_kind(store, ex.id, "blocked")
        flag.touch()
        done = await wait_status(store, ex.id, Status.FAILED, Status.COMPLETED)
    assert done.status == Status.FAILED, (
        f"the replay called step {step_name(_second)} where the history has "
        f"{step_name(_first)}, yet the execution ended {done.status}: "
        f"{await kinds(store, ex.id)}")
    assert done.error["code"] == "nondeterminism"


# -- unit: Context replay against synthetic histories ----------------------------------------


class NoStore:
    """A store that must not be used: a replay decides from the journal alone."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the replay touched the store ({name})")


EXECUTION = uuid.UUID("00000000-0000-7000-8000-000000000001")
CHILD = uuid.UUID("00000000-0000-7000-8000-000000000002")
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def ev(seq: int, kind: str, **data: Any) -> HistoryEvent:
    return HistoryEvent(EXECUTION, seq, kind, T0 + timedelta(seconds=seq), data)


def context(*journal: HistoryEvent) -> Context:
    events = [ev(1, "pending"), ev(2, "running", owner="w", epoch=1, attempt=1), *journal,
              ev(99, "blocked", reason="x")]
    return Context(
        store=NoStore(),
        claim=Claim(EXECUTION, "w", 2),
        execution_id=EXECUTION,
        deployment_id="d-unit",
        attempt=1,
        journal=Journal.from_history(events),
        clock_base=T0 + timedelta(hours=1),
    )


def one() -> int:
    return 1


def two() -> int:
    return 2


STEP_ONE = f"step {step_name(one)}"
STEP_TWO = f"step {step_name(two)}"
PAST = (T0 + timedelta(seconds=1)).isoformat()

Call = Callable[[Context], Awaitable[Any]]


async def call_step_one(ctx: Context) -> Any:
    return await ctx.step(one)


async def call_step_two(ctx: Context) -> Any:
    return await ctx.step(two)


async def call_sleep(ctx: Context) -> Any:
    return await ctx.sleep(1)


async def call_sleep_until(ctx: Context) -> Any:
    return await ctx.sleep_until(T0 + timedelta(days=1))


async def call_sleep_2(ctx: Context) -> Any:
    return await ctx.sleep(2)


def add(a: int, b: int) -> int:
    return a + b


async def call_add_1_2(ctx: Context) -> Any:
    return await ctx.step(add, 1, 2)


async def call_add_1_3(ctx: Context) -> Any:
    return await ctx.step(add, 1, b=3)


async def call_recv_a(ctx: Context) -> Any:
    return await ctx.recv("a")


async def call_recv_b(ctx: Context) -> Any:
    return await ctx.recv("b", timeout=5)


async def call_submit_echo(ctx: Context) -> Any:
    return await ctx.join_set().submit("test:echo/run.fn", 1)


async def call_submit_other(ctx: Context) -> Any:
    return await ctx.join_set().submit("test:other/run.fn", 1)


async def call_submit_echo_2(ctx: Context) -> Any:
    return await ctx.join_set().submit("test:echo/run.fn", 2)


async def call_schedule_echo(ctx: Context) -> Any:
    return await ctx.schedule("test:echo/run.fn", 1)


async def call_schedule_echo_2(ctx: Context) -> Any:
    return ctx.schedule("test:echo/run.fn", 2)  # not awaited: the check is at the call


async def call_schedule_other(ctx: Context) -> Any:
    return await ctx.schedule("test:other/run.fn", 1)


async def call_now(ctx: Context) -> Any:
    return ctx.now()


STEP_EV = (STEP_COMPLETED, {"name": step_name(one), "attempts": 1, "result": 1})
SLEEP_EV = (SLEEP_STARTED, {"until": PAST})
RECV_EV = (RECV_STARTED, {"topic": "a", "deadline": None})
SUBMIT_EV = (CHILD_SUBMITTED, {"child_id": str(CHILD), "ffqn": "test:echo/run.fn",
                               "params": [1], "join_set": "js0"})
SCHEDULED_EV = (SCHEDULED, {"execution_id": str(CHILD), "ffqn": "test:echo/run.fn",
                            "params": [1]})
NOW_EV = (NOW_RECORDED, {"value": PAST})
DAY = (T0 + timedelta(days=1)).isoformat()
SLEEP_1S_EV = (SLEEP_STARTED, {"until": PAST, "seconds": 1})
SLEEP_UNTIL_EV = (SLEEP_STARTED, {"until": PAST, "when": PAST})
ADD = f"step {step_name(add)}"
ADD_EV = (STEP_COMPLETED, {"name": step_name(add), "args": args_digest((1, 2), {}),
                           "attempts": 1, "result": 3})


MISMATCHES: list[tuple[str, tuple[str, dict[str, Any]], Call, str, str]] = [
    ("step vs sleep", STEP_EV, call_sleep, STEP_ONE, "sleep(1s)"),
    ("sleep vs step", SLEEP_EV, call_step_one, "sleep", STEP_ONE),
    ("step vs sleep_until", STEP_EV, call_sleep_until, STEP_ONE, f"sleep_until({DAY})"),
    ("another step", STEP_EV, call_step_two, STEP_ONE, STEP_TWO),
    ("a step with other arguments", ADD_EV, call_add_1_3,
     f"{ADD} with arguments {args_digest((1, 2), {})}",
     f"{ADD} with other arguments ({args_digest((1,), {'b': 3})})"),
    ("sleep of another duration", SLEEP_1S_EV, call_sleep_2, "sleep(1s)", "sleep(2s)"),
    ("sleep vs sleep_until", SLEEP_1S_EV, call_sleep_until, "sleep(1s)",
     f"sleep_until({DAY})"),
    ("sleep_until another time", SLEEP_UNTIL_EV, call_sleep_until, f"sleep_until({PAST})",
     f"sleep_until({DAY})"),
    ("sleep_until vs sleep", SLEEP_UNTIL_EV, call_sleep, f"sleep_until({PAST})", "sleep(1s)"),
    ("sleep vs recv", SLEEP_EV, call_recv_a, "sleep", "recv('a')"),
    ("recv vs sleep", RECV_EV, call_sleep, "recv('a')", "sleep(1s)"),
    ("recv of another topic", RECV_EV, call_recv_b, "recv('a')", "recv('b')"),
    ("submit of another ffqn", SUBMIT_EV, call_submit_other, "submit test:echo/run.fn(1)",
     "submit test:other/run.fn(1)"),
    ("submit with other params", SUBMIT_EV, call_submit_echo_2, "submit test:echo/run.fn(1)",
     "submit test:echo/run.fn(2)"),
    ("submit vs schedule", SUBMIT_EV, call_schedule_echo, "submit test:echo/run.fn(1)",
     "schedule test:echo/run.fn(1)"),
    ("schedule of another ffqn", SCHEDULED_EV, call_schedule_other,
     "schedule test:echo/run.fn(1)", "schedule test:other/run.fn(1)"),
    ("schedule with other params", SCHEDULED_EV, call_schedule_echo_2,
     "schedule test:echo/run.fn(1)", "schedule test:echo/run.fn(2)"),
    ("schedule vs submit", SCHEDULED_EV, call_submit_echo, "schedule test:echo/run.fn(1)",
     "submit test:echo/run.fn(1)"),
    ("step vs submit", STEP_EV, call_submit_echo, STEP_ONE, "submit test:echo/run.fn(1)"),
    ("now vs step", NOW_EV, call_step_one, "now()", STEP_ONE),
    ("step vs now", STEP_EV, call_now, STEP_ONE, "now()"),
]


@pytest.mark.parametrize(("recorded_ev", "call", "recorded", "new"),
                         [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES])
@pytest.mark.parametrize("pos", [0, 2])
async def test_replay_mismatch_names_both_calls(
    recorded_ev: tuple[str, dict[str, Any]], call: Call, recorded: str, new: str, pos: int
) -> None:
    # ``pos`` matching steps first, then the mismatch
    before = [ev(3 + i, STEP_COMPLETED, pos=i, name=step_name(one), attempts=1, result=1)
              for i in range(pos)]
    kind, data = recorded_ev
    ctx = context(*before, ev(3 + pos, kind, pos=pos, **data))
    for _ in range(pos):
        assert await ctx.step(one) == 1
    with pytest.raises(NondeterminismError) as info:
        await call(ctx)
    err = info.value
    assert (err.position, err.recorded, err.new) == (pos, recorded, new)
    assert str(err) == (f"nondeterminism at position {pos}: the history has {recorded}, "
                        f"but the workflow now calls {new}")
    assert ctx.steps_run == 0


async def test_join_next_mismatch() -> None:
    ctx = context(
        ev(3, CHILD_SUBMITTED, pos=0, child_id=str(CHILD), ffqn="test:echo/run.fn",
           params=[1], join_set="js0"),
        ev(4, JOIN_NEXT, pos=1, join_set="js0", child_id=str(CHILD), ffqn="test:echo/run.fn",
           status="completed", result=1, error=None),
    )
    await ctx.join_set().submit("test:echo/run.fn", 1)
    with pytest.raises(NondeterminismError) as info:
        await ctx.step(one)
    assert info.value.recorded == "next() of join set js0" and info.value.new == STEP_ONE


async def test_a_matching_replay_returns_the_recorded_outcomes_without_running_anything(
) -> None:
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")

    ctx = context(
        ev(3, NOW_RECORDED, pos=0, value=PAST),
        ev(4, STEP_COMPLETED, pos=1, name=step_name(one), attempts=1, result=41),
        ev(5, STEP_FAILED, pos=2, name=step_name(boom), attempts=3,
           error={"type": "KeyError", "message": "'k'"}),
        ev(6, SLEEP_STARTED, pos=3, until=PAST),
        ev(7, CHILD_SUBMITTED, pos=4, child_id=str(CHILD), ffqn="test:echo/run.fn",
           params=[1], join_set="js0"),
        ev(8, JOIN_NEXT, pos=5, join_set="js0", child_id=str(CHILD), ffqn="test:echo/run.fn",
           status="failed", result=None, error={"code": "workflow_error"}),
        ev(9, SCHEDULED, pos=6, execution_id=str(EXECUTION), ffqn="test:echo/run.fn",
           params=[2]),
        ev(10, RECV_STARTED, pos=7, topic="a", deadline=None),
        ev(11, MESSAGE_RECEIVED, pos=7, topic="a", message_id=1, payload={"m": 1}),
        ev(12, RECV_STARTED, pos=8, topic="b", deadline=PAST),
        ev(13, RECV_TIMED_OUT, pos=8, topic="b"),
    )
    assert ctx.now() == datetime.fromisoformat(PAST)
    assert await ctx.step(one) == 41
    with pytest.raises(StepFailed) as failed:
        await ctx.step(boom)
    assert failed.value.error_type == "KeyError"
    await ctx.sleep(3600)  # recorded, and over: returns without blocking
    js = ctx.join_set()
    assert await js.submit("test:echo/run.fn", 1) == CHILD
    outcome = await js.next()
    assert outcome.execution_id == CHILD and outcome.status == Status.FAILED
    assert not outcome.ok and outcome.error == {"code": "workflow_error"}
    scheduled = ctx.schedule("test:echo/run.fn", 2)
    assert scheduled == EXECUTION and str(scheduled) == str(EXECUTION)
    plain = await scheduled  # nothing to write on a replay: the store is not touched
    assert plain == EXECUTION and type(plain) is uuid.UUID
    assert await ctx.recv("a") == {"m": 1}
    with pytest.raises(TimeoutError):
        await ctx.recv("b", timeout=1)
    assert ran == [] and ctx.steps_run == 0



async def test_a_replay_with_the_same_requests_matches() -> None:
    """Same step arguments, same sleep, same child and schedule parameters: no divergence."""
    kind, data = ADD_EV
    ctx = context(
        ev(3, kind, pos=0, **data),
        ev(4, SLEEP_STARTED, pos=1, until=PAST, seconds=2),
        ev(5, SLEEP_STARTED, pos=2, until=PAST, when=PAST),
        ev(6, CHILD_SUBMITTED, pos=3, child_id=str(CHILD), ffqn="test:echo/run.fn",
           params=[2], join_set="js0"),
        ev(7, SCHEDULED, pos=4, execution_id=str(EXECUTION), ffqn="test:echo/run.fn",
           params=[2]),
    )
    assert await call_add_1_2(ctx) == 3
    await call_sleep_2(ctx)
    await ctx.sleep_until(datetime.fromisoformat(PAST).astimezone(timezone(timedelta(hours=5))))
    assert await call_submit_echo_2(ctx) == CHILD
    assert await call_schedule_echo_2(ctx) == EXECUTION
    assert ctx.nondeterminism is None and ctx.steps_run == 0


def test_step_arguments_that_are_not_json_are_not_fingerprinted() -> None:
    """An object's repr may differ from one process to the next: such arguments are not
    compared on replay (the step's name still is)."""
    assert args_digest((object(),), {}) is None
    assert args_digest((1, 2), {}) == args_digest((1, 2), {})
    assert args_digest((1, 2), {}) != args_digest((2, 1), {})
    assert args_digest((), {"a": 1, "b": 2}) == args_digest((), {"b": 2, "a": 1})
