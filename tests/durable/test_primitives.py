"""Each durable primitive, run by a worker in-process on both backends, checked by its
result and by the history it leaves: durable sleep and sleep_until, join sets (finishing
order), call (result and ChildFailed), JoinSetEmpty, schedule (once across a replay),
recv (before/after waiting, exactly once, in order, timeout), recorded now(), and replay
after a worker restart (no step re-run, no child re-created)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests import workflows
from tests.durable._support import (
    get,
    history,
    kinds,
    make_worker,
    running,
    submit,
    until,
    wait_kind,
    wait_status,
)
from veracity import App, Context
from veracity.core.states import Status
from veracity.models import Execution, ExecutionFilter
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
    ChildFailed,
    JoinSetEmpty,
)
from veracity.worker.runner import Worker

# The workflows of tests.workflows, plus a few that only these tests use.
app = App("engine-primitives")
for _ffqn, _wf in workflows.app.workflows.items():
    app.workflow(_ffqn, timeout=_wf.timeout)(_wf.fn)

CALLS: dict[str, int] = {}


def counted(key: str) -> str:
    """A step that counts how often it really ran."""
    CALLS[key] = CALLS.get(key, 0) + 1
    return key


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


@pytest.fixture
def worker(store: Store) -> Worker:
    return make_worker(store, app)


@app.workflow("eng:until/run.fn")
async def sleep_until_wf(ctx: Context, iso: str) -> str:
    when = datetime.fromisoformat(iso)
    await ctx.sleep_until(when)
    return "woke"


@app.workflow("eng:nosleep/run.fn")
async def no_sleep(ctx: Context, iso: str) -> str:
    """Sleeps that are already over do not block."""
    await ctx.sleep(0)
    await ctx.sleep_until(datetime.fromisoformat(iso))
    return ctx.now().isoformat()


@app.workflow("eng:gate/run.fn")
async def gated_child(ctx: Context, value: Any) -> Any:
    """A child that ends when it receives a message on "go"."""
    await ctx.recv("go")
    return value


@app.workflow("eng:order/run.fn")
async def in_order(ctx: Context, values: list[Any]) -> dict[str, Any]:
    js = ctx.join_set()
    ids = [str(await js.submit("eng:gate/run.fn", v)) for v in values]
    out = []
    for _ in values:
        outcome = await js.next()
        out.append([str(outcome.execution_id), outcome.result, str(outcome.status)])
    try:
        await js.next()
    except JoinSetEmpty:
        empty = True
    else:
        empty = False
    return {"ids": ids, "ended": out, "empty_after": empty}


@app.workflow("eng:twosets/run.fn")
async def two_sets(ctx: Context) -> list[Any]:
    first, second = ctx.join_set(), ctx.join_set()
    await first.submit("eng:gate/run.fn", "in first")
    await second.submit("eng:gate/run.fn", "in second")
    from_second = await second.next()
    from_first = await first.next()
    return [from_second.result, from_first.result]


@app.workflow("eng:empty/run.fn")
async def empty_set(ctx: Context) -> str:
    try:
        await ctx.join_set().next()
    except JoinSetEmpty as exc:
        return f"JoinSetEmpty: {exc}"
    return "no error"


@app.workflow("eng:callfail/run.fn")
async def call_fails(ctx: Context) -> dict[str, Any]:
    try:
        await ctx.call("test:raise/run.fn")
    except ChildFailed as exc:
        o = exc.outcome
        return {"id": str(o.execution_id), "ffqn": o.ffqn, "status": str(o.status),
                "ok": o.ok, "error": o.error, "message": str(exc)}
    return {"status": "no ChildFailed"}


@app.workflow("eng:schedule/run.fn")
async def schedule_then_sleep(ctx: Context, value: Any, explicit: str | None) -> list[str]:
    """Schedules, then sleeps: the run after the sleep replays the schedule."""
    first = await ctx.schedule("test:echo/run.fn", value, execution_id=explicit)
    await ctx.sleep(0.15)
    second = await ctx.schedule("test:echo/run.fn", f"{value}-2")
    return [str(first), str(second)]


@app.workflow("eng:schedule-sync/run.fn")
async def schedule_without_await(ctx: Context, value: Any, then: str) -> list[str]:
    """``ctx.schedule`` as docs/workflows.md describes it (no await): the schedules
    are written with the next durable write (a step), or at the end of the run."""
    first = ctx.schedule("test:echo/run.fn", value)
    second = ctx.schedule("test:echo/run.fn", f"{value}-2")
    if then == "step":
        await ctx.step(counted, f"sched:{value}")
    elif then == "sleep":
        await ctx.sleep(0.1)
    elif then == "fail":
        raise RuntimeError("after scheduling")
    return [str(first), str(second)]


@app.workflow("eng:recv3/run.fn")
async def recv_three(ctx: Context, topic: str) -> list[Any]:
    """Three receives on one topic, with a durable sleep (hence a replay) in between."""
    first = await ctx.recv(topic)
    await ctx.sleep(0.1)
    second = await ctx.recv(topic)
    third = await ctx.recv(topic)
    return [first, second, third]


@app.workflow("eng:ident/run.fn")
async def ident(ctx: Context) -> dict[str, str]:
    return {"execution_id": str(ctx.execution_id), "deployment_id": ctx.deployment_id}


@app.workflow("eng:restart/run.fn")
async def restartable(ctx: Context, key: str) -> list[Any]:
    a = await ctx.step(counted, f"{key}:a")
    js = ctx.join_set()
    await js.submit("test:echo/run.fn", "child")
    child = await js.next()
    b = await ctx.step(counted, f"{key}:b")
    message = await ctx.recv("go")
    c = await ctx.step(counted, f"{key}:c")
    return [a, child.result, b, message, c]


# -- helpers --------------------------------------------------------------------------------


async def children_of(store: Store, parent: uuid.UUID, n: int) -> list[Execution]:
    async def check() -> list[Execution] | None:
        found, _ = await store.execution_children(parent)
        return found if len(found) >= n else None

    got: list[Execution] = await until(check, what=f"{n} children of {parent}")
    return got


def positions(events: list[Any], kind: str) -> list[int]:
    return [e.data["pos"] for e in events if e.kind == kind]


async def send(store: Store, execution_id: uuid.UUID, topic: str, payload: Any) -> None:
    result = await store.message_send(execution_id, topic, payload)
    assert result.changed and result.message is not None


# -- durable sleep ----------------------------------------------------------------------------


async def test_sleep_blocks_without_a_worker_and_completes_after_the_wake_time(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        ex = await submit(store, "test:sleep/run.fn", 0.5)
        blocked = await wait_status(store, ex.id, Status.BLOCKED)
        assert blocked.wake_at is not None
        assert blocked.lease_owner is None and blocked.lease_expires_at is None
        await asyncio.sleep(0.1)  # a couple of poll cycles: still blocked, held by nobody
        still = await get(store, ex.id)
        assert still.status == Status.BLOCKED and still.lease_owner is None
        assert ex.id not in worker.runs
        done = await wait_status(store, ex.id, Status.COMPLETED)

    evs = await history(store, ex.id)
    assert [e.kind for e in evs] == [
        "pending", "running", NOW_RECORDED, SLEEP_STARTED, "blocked", "pending", "running",
        "completed"]
    by_kind = {e.kind: e for e in evs}
    until_at = datetime.fromisoformat(by_kind[SLEEP_STARTED].data["until"])
    assert until_at == blocked.wake_at
    assert by_kind["blocked"].data["reason"] == "sleep"
    assert datetime.fromisoformat(by_kind["blocked"].data["wake_at"]) == blocked.wake_at
    assert evs[5].data == {"reason": "timer"}
    # woken no earlier than the wake time, by the store's clock
    assert evs[5].at >= blocked.wake_at
    assert done.updated_at >= blocked.wake_at
    started = datetime.fromisoformat(by_kind[NOW_RECORDED].data["value"])
    # the wake time is the sleep's start (after now() was recorded) plus its duration
    assert timedelta(seconds=0.5) <= until_at - started < timedelta(seconds=1)
    # two runs of one attempt (a replay, not a retry), each under a new lease epoch
    assert done.attempt == 1 and done.lease_epoch == 2
    assert worker.runs == {}


async def test_now_is_recorded_and_the_replay_sees_the_same_value(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        ex = await submit(store, "test:sleep/run.fn", 0.2)
        done = await wait_status(store, ex.id, Status.COMPLETED)
    (recorded,) = [e for e in await history(store, ex.id) if e.kind == NOW_RECORDED]
    assert recorded.data["pos"] == 0
    # the result was computed by the run after the sleep, from the replayed now()
    assert done.result == f"slept since {recorded.data['value']}"
    value = datetime.fromisoformat(recorded.data["value"])
    assert value.tzinfo is not None
    assert ex.created_at <= value <= recorded.at + timedelta(seconds=1)


async def test_sleep_until_blocks_until_the_given_time(store: Store, worker: Worker) -> None:
    when = await store.db_now() + timedelta(seconds=0.4)
    async with running(worker):
        ex = await submit(store, "eng:until/run.fn", when.isoformat())
        blocked = await wait_status(store, ex.id, Status.BLOCKED)
        assert blocked.wake_at == when
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result == "woke"
    evs = await history(store, ex.id)
    (started,) = [e for e in evs if e.kind == SLEEP_STARTED]
    assert started.data == {"pos": 0, "until": when.isoformat(), "when": when.isoformat()}
    (woken,) = [e for e in evs if e.kind == "pending" and e.data.get("reason") == "timer"]
    assert woken.at >= when


async def test_sleeps_already_over_do_not_block(store: Store, worker: Worker) -> None:
    past = await store.db_now() - timedelta(hours=1)
    async with running(worker):
        ex = await submit(store, "eng:nosleep/run.fn", past.isoformat())
        done = await wait_status(store, ex.id, Status.COMPLETED)
    ks = await kinds(store, ex.id)
    assert "blocked" not in ks
    assert ks[:2] == ["pending", "running"] and ks[-1] == "completed"
    assert done.lease_epoch == 1


async def test_execution_and_deployment_ids_are_on_the_context(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        ex = await submit(store, "eng:ident/run.fn")
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result == {"execution_id": str(ex.id), "deployment_id": ex.deployment_id}


# -- children and join sets ---------------------------------------------------------------------


async def test_join_set_returns_children_in_the_order_they_ended(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        parent = await submit(store, "eng:order/run.fn", ["a", "b", "c"])
        kids = await children_of(store, parent.id, 3)
        by_value = {k.params[0]: k for k in kids}
        blocked = await wait_status(store, parent.id, Status.BLOCKED)
        assert blocked.lease_owner is None and parent.id not in worker.runs
        for k in kids:
            assert k.parent_id == parent.id and k.join_set == "js0"
            await wait_status(store, k.id, Status.BLOCKED)
        # end them in reverse order of submission, one at a time
        for value in ["c", "a", "b"]:
            await send(store, by_value[value].id, "go", None)
            await wait_status(store, by_value[value].id, Status.COMPLETED)
        done = await wait_status(store, parent.id, Status.COMPLETED)

    ended = [[str(by_value[v].id), v, "completed"] for v in ["c", "a", "b"]]
    assert done.result == {
        "ids": [str(by_value[v].id) for v in ["a", "b", "c"]],
        "ended": ended,
        "empty_after": True,
    }
    evs = await history(store, parent.id)
    submitted = [e for e in evs if e.kind == CHILD_SUBMITTED]
    assert [e.data["child_id"] for e in submitted] == [str(by_value[v].id) for v in "abc"]
    assert [e.data["pos"] for e in submitted] == [0, 1, 2]
    assert all(e.data["ffqn"] == "eng:gate/run.fn" and e.data["join_set"] == "js0"
               for e in submitted)
    joins = [e for e in evs if e.kind == JOIN_NEXT]
    assert [e.data["child_id"] for e in joins] == [str(by_value[v].id) for v in "cab"]
    assert [e.data["result"] for e in joins] == ["c", "a", "b"]
    assert [e.data["pos"] for e in joins] == [3, 4, 5]
    # each child's end woke the parent (blocked -> pending) with its reason
    woken = [e for e in evs if e.kind == "pending" and e.data.get("reason") == "child ended"]
    assert woken and {e.data["child_id"] for e in woken} <= {str(k.id) for k in kids}
    assert all(e.data["reason"] == "waiting for a child of join set js0"
               for e in evs if e.kind == "blocked")
    # three children, no more, whatever the number of replays
    assert len(await store.execution_list(ExecutionFilter(ffqn_prefix="eng:gate/"),
                                          limit=100)) == 3


async def test_next_waits_only_for_children_of_its_own_join_set(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        parent = await submit(store, "eng:twosets/run.fn")
        kids = await children_of(store, parent.id, 2)
        by_value = {k.params[0]: k for k in kids}
        assert {k.join_set for k in kids} == {"js0", "js1"}
        await wait_status(store, parent.id, Status.BLOCKED)
        # the child of the first set ends first; the parent waits on the second set
        await send(store, by_value["in first"].id, "go", None)
        await wait_status(store, by_value["in first"].id, Status.COMPLETED)
        await asyncio.sleep(0.15)
        assert (await get(store, parent.id)).status == Status.BLOCKED
        await send(store, by_value["in second"].id, "go", None)
        done = await wait_status(store, parent.id, Status.COMPLETED)
    assert done.result == ["in second", "in first"]
    joins = [e for e in await history(store, parent.id) if e.kind == JOIN_NEXT]
    assert [(e.data["join_set"], e.data["result"]) for e in joins] == [
        ("js1", "in second"), ("js0", "in first")]


async def test_parent_with_echo_children_gets_every_result(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        ex = await submit(store, "test:parent/run.fn", [1, 2, 3, 4])
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert sorted(done.result) == [1, 2, 3, 4]
    evs = await history(store, ex.id)
    joins = [e for e in evs if e.kind == JOIN_NEXT]
    # the result lists children in the order the join recorded them
    assert [e.data["result"] for e in joins] == done.result
    kids, _ = await store.execution_children(ex.id)
    assert len(kids) == 4 and all(k.status == Status.COMPLETED for k in kids)
    # the join order is the children's order of ending, by the store
    assert [e.data["child_id"] for e in joins] == [str(k.id) for k in kids]


async def test_call_returns_the_childs_result(store: Store, worker: Worker) -> None:
    async with running(worker):
        ex = await submit(store, "test:call/run.fn", {"deep": [1, "two"]})
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result == {"deep": [1, "two"]}
    evs = await history(store, ex.id)
    ks = [e.kind for e in evs]
    # the child may end before the parent blocks (the block then turns to pending at once),
    # or even before the parent looks: all three are right
    assert ks in (
        ["pending", "running", CHILD_SUBMITTED, "blocked", "pending", "running", JOIN_NEXT,
         "completed"],
        ["pending", "running", CHILD_SUBMITTED, "pending", "running", JOIN_NEXT, "completed"],
        ["pending", "running", CHILD_SUBMITTED, JOIN_NEXT, "completed"],
    ), ks
    child_id = uuid.UUID(evs[2].data["child_id"])
    child = await get(store, child_id)
    assert child.parent_id == ex.id and child.ffqn == "test:echo/run.fn"
    assert child.status == Status.COMPLETED and child.result == {"deep": [1, "two"]}
    (join,) = [e for e in evs if e.kind == JOIN_NEXT]
    assert join.data["child_id"] == str(child_id) and join.data["status"] == "completed"
    assert join.data["pos"] == 1
    if ks[3] == "blocked":
        assert evs[4].data["reason"] == "child ended"
    elif ks[3] == "pending":
        assert evs[3].data["woken"] == "signalled"


async def test_call_of_a_failing_child_raises_child_failed(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        ex = await submit(store, "eng:callfail/run.fn")
        done = await wait_status(store, ex.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    out = done.result
    child = await get(store, uuid.UUID(out["id"]))
    assert child.status == Status.FAILED and child.parent_id == ex.id
    assert out["ffqn"] == "test:raise/run.fn"
    assert out["status"] == "failed" and out["ok"] is False
    assert out["error"]["code"] == "workflow_error"
    assert out["error"]["message"] == "the workflow's own error"
    assert out["error"] == child.error
    assert "ended failed" in out["message"] and out["id"] in out["message"]
    (join,) = [e for e in await history(store, ex.id) if e.kind == JOIN_NEXT]
    assert join.data["status"] == "failed" and join.data["error"] == child.error


async def test_next_on_an_empty_join_set_raises_join_set_empty(
    store: Store, worker: Worker
) -> None:
    async with running(worker):
        ex = await submit(store, "eng:empty/run.fn")
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result.startswith("JoinSetEmpty: ")
    assert "js0" in done.result
    # nothing was waited for: no block, no journal event for the failed next()
    assert await kinds(store, ex.id) == ["pending", "running", "completed"]


# -- schedule ----------------------------------------------------------------------------------


async def test_schedule_creates_a_top_level_execution_once_across_a_replay(
    store: Store, worker: Worker
) -> None:
    explicit = uuid.uuid4()
    async with running(worker):
        ex = await submit(store, "eng:schedule/run.fn", "v", str(explicit))
        done = await wait_status(store, ex.id, Status.COMPLETED)
        first, second = (uuid.UUID(x) for x in done.result)
        scheduled = [await wait_status(store, i, Status.COMPLETED) for i in (first, second)]

    assert first == explicit
    assert [s.result for s in scheduled] == ["v", "v-2"]
    for s in scheduled:
        assert s.parent_id is None and s.join_set is None
        assert s.ffqn == "test:echo/run.fn"
        assert s.deployment_id == ex.deployment_id
    evs = await history(store, ex.id)
    assert [e.kind for e in evs].count("running") == 2  # it did replay after the sleep
    sched = [e for e in evs if e.kind == SCHEDULED]
    assert [(e.data["pos"], e.data["execution_id"], e.data["params"]) for e in sched] == [
        (0, str(first), ["v"]), (2, str(second), ["v-2"])]
    # exactly two echo executions exist: the replay did not schedule the first again
    echoes = await store.execution_list(ExecutionFilter(ffqn_prefix="test:echo/"), limit=100)
    assert sorted(e.id for e in echoes) == sorted([first, second])
    kids, _ = await store.execution_children(ex.id)
    assert kids == []
    assert (await kinds(store, first))[0] == "pending"


@pytest.mark.parametrize("then", ["return", "step", "sleep", "fail"])
async def test_schedule_without_await_is_written_with_the_next_write_or_the_end(
    store: Store, worker: Worker, then: str
) -> None:
    async with running(worker):
        ex = await submit(store, "eng:schedule-sync/run.fn", then, then)
        end = Status.FAILED if then == "fail" else Status.COMPLETED
        done = await wait_status(store, ex.id, end)
        evs = await history(store, ex.id)
        sched = [e for e in evs if e.kind == SCHEDULED]
        ids = [uuid.UUID(str(e.data["execution_id"])) for e in sched]
        scheduled = [await wait_status(store, i, Status.COMPLETED) for i in ids]

    assert [s.result for s in scheduled] == [then, f"{then}-2"]
    assert all(s.parent_id is None for s in scheduled)
    if then != "fail":
        assert done.result == [str(i) for i in ids]
    # both records precede what came after them in the workflow, in call order
    assert [e.data["pos"] for e in sched] == [0, 1]
    after = {"return": "completed", "step": STEP_COMPLETED, "sleep": SLEEP_STARTED,
             "fail": "failed"}[then]
    names = [e.kind for e in evs]
    assert names.index(after) > names.index(SCHEDULED)
    echoes = await store.execution_list(ExecutionFilter(ffqn_prefix="test:echo/"), limit=100)
    assert sorted(e.id for e in echoes) == sorted(ids)  # a replay (sleep) made no more


# -- messages -------------------------------------------------------------------------------


async def test_recv_gets_messages_sent_before_and_after_waiting_once_each_in_order(
    store: Store, worker: Worker
) -> None:
    ex = await submit(store, "eng:recv3/run.fn", "t", paused=True)
    # two messages before the workflow ever runs, and one on another topic
    await send(store, ex.id, "t", "first")
    await send(store, ex.id, "t", {"n": 2})
    await send(store, ex.id, "other", "not for recv('t')")
    async with running(worker):
        unpaused = await store.execution_unpause(ex.id)
        assert unpaused.execution is not None and unpaused.execution.status == Status.PENDING
        started = await wait_kind(store, ex.id, RECV_STARTED)
        assert started[0].data == {"pos": 3, "topic": "t", "deadline": None}
        blocked = await wait_status(store, ex.id, Status.BLOCKED)
        assert blocked.wake_at is None and blocked.lease_owner is None
        await send(store, ex.id, "t", "third")
        done = await wait_status(store, ex.id, Status.COMPLETED)

    assert done.result == ["first", {"n": 2}, "third"]
    evs = await history(store, ex.id)
    arrived = [e for e in evs if e.kind == "message_arrived"]
    received = [e for e in evs if e.kind == MESSAGE_RECEIVED]
    assert [e.data["topic"] for e in arrived] == ["t", "t", "other", "t"]
    # positions: recv 0, sleep 1, recv 2, recv 3
    assert [(e.data["pos"], e.data["payload"]) for e in received] == [
        (0, "first"), (2, {"n": 2}), (3, "third")]
    ids = [e.data["message_id"] for e in received]
    assert ids == [arrived[0].data["message_id"], arrived[1].data["message_id"],
                   arrived[3].data["message_id"]]
    assert len(set(ids)) == 3
    # the message that came while it waited woke it
    woke = [e for e in evs if e.kind == "pending" and e.data.get("reason") == "message arrived"]
    assert [e.data["topic"] for e in woke] == ["t"]
    assert positions(evs, RECV_STARTED) == [3]
    assert [e.kind for e in evs].count("running") >= 3  # replays did not take messages again


async def test_recv_with_a_timeout_times_out(store: Store, worker: Worker) -> None:
    async with running(worker):
        ex = await submit(store, "test:recv/run.fn", "never", 0.3)
        blocked = await wait_status(store, ex.id, Status.BLOCKED)
        assert blocked.wake_at is not None
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result == "timed out"
    evs = await history(store, ex.id)
    assert [e.kind for e in evs] == [
        "pending", "running", RECV_STARTED, "blocked", "pending", "running", RECV_TIMED_OUT,
        "completed"]
    deadline = datetime.fromisoformat(evs[2].data["deadline"])
    assert deadline == blocked.wake_at
    assert evs[3].data["reason"] == "waiting for a message on 'never'"
    assert evs[4].data == {"reason": "timer"} and evs[4].at >= deadline
    assert evs[6].data == {"pos": 0, "topic": "never"}


async def test_recv_with_a_timeout_gets_a_message_in_time(store: Store, worker: Worker) -> None:
    async with running(worker):
        ex = await submit(store, "test:recv/run.fn", "soon", 5)
        await wait_status(store, ex.id, Status.BLOCKED)
        await send(store, ex.id, "soon", [1, 2])
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result == [1, 2]
    ks = await kinds(store, ex.id)
    assert RECV_TIMED_OUT not in ks
    assert ks.count(MESSAGE_RECEIVED) == 1


async def test_recv_with_a_zero_timeout_does_not_block(store: Store, worker: Worker) -> None:
    async with running(worker):
        ex = await submit(store, "test:recv/run.fn", "nothing", 0)
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result == "timed out"
    assert await kinds(store, ex.id) == ["pending", "running", RECV_TIMED_OUT, "completed"]


# -- replay after a worker restart -----------------------------------------------------------


async def test_a_sleep_outlives_its_worker(store: Store) -> None:
    first = make_worker(store, app)
    async with running(first):
        ex = await submit(store, "test:sleep/run.fn", 0.3)
        blocked = await wait_status(store, ex.id, Status.BLOCKED)
    assert blocked.wake_at is not None
    await asyncio.sleep(0.4)  # past the wake time, with no worker at all
    assert (await get(store, ex.id)).status in (Status.BLOCKED, Status.PENDING)
    second = make_worker(store, app)
    async with running(second):
        done = await wait_status(store, ex.id, Status.COMPLETED)
    (recorded,) = [e for e in await history(store, ex.id) if e.kind == NOW_RECORDED]
    assert done.result == f"slept since {recorded.data['value']}"
    owners = [e.data["owner"] for e in await history(store, ex.id) if e.kind == "running"]
    assert owners == [first.id, second.id]



async def test_replay_after_a_worker_restart_runs_no_step_twice_nor_creates_children_again(
    store: Store,
) -> None:
    key = uuid.uuid4().hex[:8]
    first = make_worker(store, app)
    async with running(first):
        ex = await submit(store, "eng:restart/run.fn", key)
        await wait_kind(store, ex.id, RECV_STARTED)
        await wait_status(store, ex.id, Status.BLOCKED)
    assert CALLS == {f"{key}:a": 1, f"{key}:b": 1}
    stopped = await get(store, ex.id)
    assert stopped.status == Status.BLOCKED and stopped.lease_owner is None

    second = make_worker(store, app)
    assert second.id != first.id
    async with running(second):
        await send(store, ex.id, "go", "going")
        done = await wait_status(store, ex.id, Status.COMPLETED)

    assert done.result == [f"{key}:a", "child", f"{key}:b", "going", f"{key}:c"]
    assert CALLS == {f"{key}:a": 1, f"{key}:b": 1, f"{key}:c": 1}
    evs = await history(store, ex.id)
    assert positions(evs, STEP_COMPLETED) == [0, 3, 5]
    assert positions(evs, CHILD_SUBMITTED) == [1]
    assert positions(evs, JOIN_NEXT) == [2]
    assert positions(evs, MESSAGE_RECEIVED) == [4]
    kids, _ = await store.execution_children(ex.id)
    assert len(kids) == 1
    owners = [e.data["owner"] for e in evs if e.kind == "running"]
    assert owners[-1] == second.id and first.id in owners


async def test_a_worker_stopped_mid_run_hands_over_at_a_step_boundary(store: Store) -> None:
    first = make_worker(store, app)
    async with running(first):
        ex = await submit(store, "test:ticker/tick.run", 12)
        await wait_kind(store, ex.id, STEP_COMPLETED, count=3)
    released = await get(store, ex.id)
    assert released.status == Status.PENDING and released.lease_owner is None
    done_before = positions(await history(store, ex.id), STEP_COMPLETED)
    assert 3 <= len(done_before) < 12

    second = make_worker(store, app)
    async with running(second):
        done = await wait_status(store, ex.id, Status.COMPLETED)
    assert done.result == sum(range(12))
    evs = await history(store, ex.id)
    # every position checkpointed exactly once: nothing re-ran after the hand-over
    assert positions(evs, STEP_COMPLETED) == list(range(12))
    assert [e.kind for e in evs].count("running") == 2
