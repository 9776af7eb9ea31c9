"""A workflow's new children and schedules of a workflow its worker's app registers are
checked against that workflow's signature (docs/workflows.md, "Params are checked"): params
that do not fit raise InvalidParams at the call, before anything is written (no execution,
no history event); workflow code may catch it and go on, uncaught it fails the execution.
A call already recorded replays as recorded, unchecked; a workflow the app does not
register is not checked. With a worker on both backends, and ``replay`` of the histories.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests._helpers import store_fixture
from tests.durable._support import (
    history,
    make_worker,
    running,
    submit,
    wait_kind,
    wait_status,
)
from veracity import App, Context, InvalidParams
from veracity.core.states import Status
from veracity.models import JSON, ExecutionFilter, HistoryEvent
from veracity.store import Store
from veracity.testing import replay_async
from veracity.worker.context import CHILD_SUBMITTED, RECV_STARTED, SCHEDULED

pytestmark = pytest.mark.timeout(60)

store = store_fixture(pool_size=4)

TWO = "tp:child/two.fn"
DEFAULTS = "tp:child/defaults.fn"
KWONLY = "tp:child/kwonly.fn"
STAR = "tp:child/star.fn"
FAR = "tp:elsewhere/far.fn"  # registered by no app of these tests


def children(app: App) -> App:
    """``app`` with the children every parent of these tests calls."""

    @app.workflow(TWO)
    async def two(ctx: Context, order: str, amount: int) -> str:
        return f"{order}:{amount}"

    @app.workflow(DEFAULTS)
    async def defaults(ctx: Context, a: str, b: int = 2) -> list[Any]:
        return [a, b]

    @app.workflow(KWONLY)
    async def kwonly(ctx: Context, a: str, *, key: str) -> str:
        return a + key

    @app.workflow(STAR)
    async def star(ctx: Context, *items: Any) -> int:
        return len(items)

    return app


app = children(App())


@app.workflow("tp:parent/try.fn")
async def attempt(ctx: Context, via: str, target: str, params: list[Any]) -> dict[str, Any]:
    """Make one call ``via`` ctx.call, js.submit or ctx.schedule; catch InvalidParams; then
    go on with a call that fits (its position is the next one: the bad call took one)."""
    out: dict[str, Any] = {"error": None, "result": None}
    try:
        if via == "call":
            out["result"] = await ctx.call(target, *params)
        elif via == "submit":
            js = ctx.join_set()
            await js.submit(target, *params)
            out["result"] = (await js.next()).result
        else:
            scheduled = ctx.schedule(target, *params)
            out["result"] = str(await scheduled)
    except InvalidParams as exc:
        assert isinstance(exc, TypeError) and exc.ffqn == target
        out["error"] = str(exc)
    out["after"] = await ctx.call(TWO, "o", 1)
    return out


@app.workflow("tp:parent/caught.fn")
async def caught(ctx: Context) -> list[JSON]:
    """Catches InvalidParams, then waits for a message: it runs again from the top."""
    try:
        await ctx.call(TWO, "o")
    except InvalidParams as exc:
        error = str(exc)
    go = await ctx.recv("go")
    return [error, go, await ctx.call(TWO, "o", 1)]


@app.workflow("tp:parent/uncaught.fn")
async def uncaught(ctx: Context) -> JSON:
    return await ctx.call(TWO, "o")


@app.workflow("tp:parent/far.fn")
async def far(ctx: Context) -> list[str]:
    """Children and schedules of a workflow no app here registers: not checked."""
    js = ctx.join_set()
    child = await js.submit(FAR, 1, 2, 3)
    scheduled = ctx.schedule(FAR)
    return [str(child), str(scheduled)]


def message(via: str, ffqn: str, problem: str) -> str:
    return f"{via}({ffqn!r}, ...): {problem}"


# (via, target, params, the message of InvalidParams or None: accepted, with its result)
CASES: list[tuple[str, str, list[Any], str | None, JSON]] = [
    ("call", TWO, ["o"], message("ctx.call", TWO, "it takes exactly 2 params (order, "
                                 "amount); got 1: missing amount"), None),
    ("call", TWO, [], message("ctx.call", TWO, "it takes exactly 2 params (order, amount); "
                              "got 0: missing order, amount"), None),
    ("call", TWO, ["o", 1, 2], message("ctx.call", TWO, "it takes exactly 2 params (order, "
                                       "amount); got 3"), None),
    ("call", TWO, ["o", 5], None, "o:5"),
    ("call", KWONLY, ["a"], message(
        "ctx.call", KWONLY, "it requires keyword-only parameter(s) key without a default, "
        "which params (positional) cannot give; its parameters: (a, *, key)"), None),
    ("call", STAR, [], None, 0),
    ("call", STAR, [1, "b", None, [4]], None, 4),
    ("call", DEFAULTS, ["a"], None, ["a", 2]),
    ("call", DEFAULTS, ["a", 3], None, ["a", 3]),
    ("call", DEFAULTS, [], message("ctx.call", DEFAULTS, "it takes 1 to 2 params (a, b=2); "
                                   "got 0: missing a"), None),
    ("call", DEFAULTS, ["a", 3, 4], message("ctx.call", DEFAULTS, "it takes 1 to 2 params "
                                            "(a, b=2); got 3"), None),
    ("submit", TWO, ["o"], message("js.submit", TWO, "it takes exactly 2 params (order, "
                                   "amount); got 1: missing amount"), None),
    ("submit", DEFAULTS, ["a"], None, ["a", 2]),
    ("schedule", DEFAULTS, ["a"], None, None),
    ("schedule", TWO, ["o", 1, 2], message("ctx.schedule", TWO, "it takes exactly 2 params "
                                           "(order, amount); got 3"), None),
    ("schedule", KWONLY, ["a"], message(
        "ctx.schedule", KWONLY, "it requires keyword-only parameter(s) key without a "
        "default, which params (positional) cannot give; its parameters: (a, *, key)"),
     None),
]


def spawns(events: list[HistoryEvent]) -> list[HistoryEvent]:
    return [e for e in events if e.kind in (CHILD_SUBMITTED, SCHEDULED)]


async def all_executions(store: Store) -> list[Any]:
    return await store.execution_list(ExecutionFilter(), limit=100)


@pytest.mark.parametrize(("via", "target", "params", "error", "result"), CASES,
                         ids=[f"{c[0]}-{c[1].split('/')[1]}-{len(c[2])}-"
                              f"{'bad' if c[3] else 'ok'}" for c in CASES])
async def test_a_call_is_checked_and_a_bad_one_writes_nothing(
        store: Store, via: str, target: str, params: list[Any], error: str | None,
        result: JSON) -> None:
    worker = make_worker(store, app)
    async with running(worker):
        parent = await submit(store, "tp:parent/try.fn", via, target, params)
        done = await wait_status(store, parent.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    assert isinstance(done.result, dict)
    assert done.result["error"] == error
    assert done.result["after"] == "o:1"
    events = await history(store, parent.id)
    made = spawns(events)
    everything = await all_executions(store)
    if error is not None:
        # nothing written for the bad call: only the call that fits after it, at position
        # 1 (the bad call took position 0 and left it empty), and its child
        assert [(e.kind, e.data["pos"], e.data["ffqn"], e.data["params"]) for e in made] \
            == [(CHILD_SUBMITTED, 1, TWO, ["o", 1])]
        assert not [e for e in events if isinstance(e.data, dict) and e.data.get("pos") == 0]
        assert sorted(e.ffqn for e in everything) == sorted(["tp:parent/try.fn", TWO])
        return
    if via == "schedule":
        assert done.result["result"] == str(made[0].data["execution_id"])
    else:
        assert done.result["result"] == result
    after = 1 if via == "schedule" else 2  # a child's next() takes position 1
    assert [(e.data["pos"], e.data["ffqn"], e.data["params"]) for e in made] == [
        (0, target, params), (after, TWO, ["o", 1])]
    assert len(everything) == 3


async def test_uncaught_it_fails_the_execution_with_its_message(store: Store) -> None:
    worker = make_worker(store, app)
    async with running(worker):
        parent = await submit(store, "tp:parent/uncaught.fn")
        done = await wait_status(store, parent.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.FAILED
    assert isinstance(done.error, dict)
    assert (done.error["code"], done.error["type"]) == ("workflow_error", "InvalidParams")
    assert done.error["message"] == message(
        "ctx.call", TWO, "it takes exactly 2 params (order, amount); got 1: missing amount")
    assert spawns(await history(store, parent.id)) == []
    assert [e.id for e in await all_executions(store)] == [parent.id]


async def test_a_workflow_the_app_does_not_register_is_not_checked(store: Store) -> None:
    worker = make_worker(store, app)
    async with running(worker):
        parent = await submit(store, "tp:parent/far.fn")
        done = await wait_status(store, parent.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    assert isinstance(done.result, list)
    made = {e.id: e for e in await all_executions(store) if e.ffqn == FAR}
    assert sorted(str(i) for i in made) == sorted(done.result)
    assert sorted(len(e.params) for e in made.values()) == [0, 3]
    assert all(e.status == Status.PENDING for e in made.values())  # no worker runs them


async def test_a_run_that_caught_it_replays_the_same(store: Store) -> None:
    """The parent caught InvalidParams and blocked on a message; it then ran again from
    the top: the bad call raised again at the same position, left empty, and the calls
    after it replayed as recorded. ``replay`` of the history does the same (it checks a
    call beyond the recorded ones as the worker does): consistent, to the end."""
    worker = make_worker(store, app)
    async with running(worker):
        parent = await submit(store, "tp:parent/caught.fn")
        await wait_kind(store, parent.id, RECV_STARTED)
        await wait_status(store, parent.id, Status.BLOCKED)
        early = await replay_async(app, await history(store, parent.id))
        assert early.consistent and early.waiting and early.position == 1, early
        assert (await store.message_send(parent.id, "go", "yes")).message is not None
        done = await wait_status(store, parent.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    problem = "it takes exactly 2 params (order, amount); got 1: missing amount"
    assert done.result == [message("ctx.call", TWO, problem), "yes", "o:1"]
    events = await history(store, parent.id)
    assert [e.kind for e in events].count("running") >= 2  # it ran again from the top
    assert [e.data["pos"] for e in spawns(events)] == [2]
    replayed = await replay_async(app, events)
    assert replayed.consistent and replayed.finished, replayed
    assert replayed.replayed == 3  # the recv at 1, the child at 2, its next() at 3


# -- a recorded call whose params no longer fit ---------------------------------------------

old_app = App()


@old_app.workflow(TWO)
async def two_old(ctx: Context, order: str) -> str:
    return f"{order}:old"


@old_app.workflow("tp:parent/recorded.fn")
async def recorded_old(ctx: Context) -> list[JSON]:
    charged = await ctx.call(TWO, "o")  # fits the old signature
    go = await ctx.recv("go")
    return [charged, go]


new_app = children(App())  # TWO now takes (order, amount)


@new_app.workflow("tp:parent/recorded.fn")
async def recorded_new(ctx: Context) -> list[JSON]:
    charged = await ctx.call(TWO, "o")  # recorded: replays as recorded, unchecked
    go = await ctx.recv("go")
    return [charged, go]


async def test_a_recorded_call_replays_unchecked(store: Store) -> None:
    """A call recorded before its workflow's signature changed replays as recorded: the
    new code's worker finishes the execution, and ``replay`` of the history is
    consistent. A new call of the same shape is refused by the new code."""
    async with running(make_worker(store, old_app)):
        parent = await submit(store, "tp:parent/recorded.fn")
        await wait_kind(store, parent.id, RECV_STARTED)
        await wait_status(store, parent.id, Status.BLOCKED)
    assert (await store.message_send(parent.id, "go", "yes")).message is not None
    async with running(make_worker(store, new_app)):
        done = await wait_status(store, parent.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    assert done.result == ["o:old", "yes"]
    events = await history(store, parent.id)
    replayed = await replay_async(new_app, events)
    assert replayed.consistent and replayed.finished, replayed
    # a new run of the same code is refused at the call
    async with running(make_worker(store, new_app)):
        again = await submit(store, "tp:parent/recorded.fn")
        failed = await wait_status(store, again.id, Status.COMPLETED, Status.FAILED)
    assert failed.status == Status.FAILED and isinstance(failed.error, dict)
    assert failed.error["type"] == "InvalidParams"


def test_the_exception_is_public() -> None:
    import veracity

    exc = veracity.InvalidParams("ctx.call('a:b/c.d', ...)", "a:b/c.d", "it takes 0")
    assert isinstance(exc, TypeError)
    assert (str(exc), exc.call, exc.ffqn, exc.problem) == (
        "ctx.call('a:b/c.d', ...): it takes 0", "ctx.call('a:b/c.d', ...)", "a:b/c.d",
        "it takes 0")
