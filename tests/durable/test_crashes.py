"""Crashes of real worker processes around the durable waits (issue 4).

Every test starts ``veracity worker`` subprocesses (``tests.workflows:app``, short leases:
TTL 1.5 s, heartbeat 0.3 s, poll 0.1 s) against its own fresh database, on both backends,
submits through the store in this process, and ticks lease recovery here
(``RecoveryService.run_once()`` every 0.1 s while it waits):

1. kill -9 during a durable sleep;
2. kill -9 while a parent waits for its children (fast children kept pending, and a
   three-level tree whose leaves wait for messages);
3. kill -9 while an execution waits for a message;
4. kill -9 between a child's creation and the parent's next step: made deterministic with a
   fault held in the database, and also as the natural race, retried until it is hit;
5. a graceful restart (SIGTERM) in the middle of a join.

A blocked execution holds no lease, so a crash during a wait needs no recovery at all: those
tests assert recovery never touched the execution and its attempt stays 1. Only the crash
while the parent *runs* (4) needs lease expiry and recovery.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest

from tests._helpers import get, history, store_fixture
from tests.durable._procs import (
    ENGINE_ENV,
    PARENTS_APP,
    Processes,
    Recovery,
    WorkerProcess,
    hold_after_child,
    hold_writes,
    registered,
    release_hold,
    sql,
    wait_until,
)
from veracity._ids import new_execution_id
from veracity.core.states import Status
from veracity.models import JSON, Execution, HistoryEvent, NewExecution
from veracity.store import Store

SLEEP = "test:sleep/run.fn"
PARENT = "test:parent/run.fn"
CALL = "test:call/run.fn"
ECHO = "test:echo/run.fn"
RECV = "test:recv/run.fn"
SCHEDULE = "test:schedule/run.fn"
TOP = "test:top/top.run-cancellable"
MID = "test:mid/run.fn"
WAITER = "test:waiter/wait.run-cancellable"
DEPLOYMENT = "d-crash-tests"
SHUTDOWN_REASON = "worker shutting down"  # veracity.worker.runner.SHUTDOWN_REASON


# -- fixtures and helpers ---------------------------------------------------------------------


db = store_fixture(pool_size=8, name="db")


@pytest.fixture
def recovery(db: Store, procs: Processes) -> Recovery:
    return Recovery(db, procs)


def start_worker(procs: Processes, url: str, *, parents_only: bool = False) -> WorkerProcess:
    """``veracity worker`` on the test App, or on ``parents_app`` (claims parents, never
    their children)."""
    env = {**ENGINE_ENV, "VERACITY_DEPLOYMENT_ID": DEPLOYMENT}
    if parents_only:
        env["VERACITY_APP"] = PARENTS_APP
    return procs.worker(url, env=env)


async def submit(db: Store, ffqn: str, *params: JSON) -> uuid.UUID:
    done = await db.execution_submit(NewExecution(
        ffqn=ffqn, params=list(params), deployment_id=DEPLOYMENT, id=new_execution_id()))
    return done.execution.id


def of_kind(events: Sequence[HistoryEvent], kind: str) -> list[HistoryEvent]:
    return [e for e in events if e.kind == kind]


async def children_rows(url: str, parent: uuid.UUID) -> list[tuple[uuid.UUID, str, Any]]:
    """Every execution whose parent_id is ``parent`` (id, ffqn, params), read with SQL."""
    rows = await sql(
        url,
        "SELECT id, ffqn, params FROM veracity_executions WHERE parent_id = %s ORDER BY id",
        "SELECT id, ffqn, params FROM veracity_executions WHERE parent_id = ? ORDER BY id",
        [parent],
    )
    return [(uuid.UUID(str(i)), str(f), json.loads(p) if isinstance(p, str) else p)
            for i, f, p in rows]


async def count_all(url: str) -> int:
    rows = await sql(url, "SELECT count(*) FROM veracity_executions",
                     "SELECT count(*) FROM veracity_executions")
    return int(rows[0][0])


async def wait_status(db: Store, recovery: Recovery, ident: uuid.UUID, *statuses: Status,
                      timeout: float = 20.0, held: bool | None = None) -> Execution:
    """Tick recovery until the execution has one of ``statuses`` (and, with ``held``, a
    lease or none)."""
    async def check() -> Execution | None:
        e = await get(db, ident)
        if e.status not in statuses:
            return None
        if held is not None and (e.lease_owner is not None) != held:
            return None
        return e

    found: Execution = await recovery.until(
        check, timeout, f"{ident} to be {'/'.join(statuses)}")
    return found


async def blocked(db: Store, recovery: Recovery, ident: uuid.UUID,
                  timeout: float = 20.0) -> Execution:
    """Wait until the execution is blocked, holding no lease."""
    e = await wait_status(db, recovery, ident, Status.BLOCKED, timeout=timeout, held=False)
    assert e.lease_expires_at is None
    return e


def claims(events: Sequence[HistoryEvent]) -> list[dict[str, Any]]:
    """The data of every ``running`` event (one per claim: owner, epoch, attempt)."""
    out: list[dict[str, Any]] = []
    for e in of_kind(events, "running"):
        assert isinstance(e.data, dict)
        out.append(e.data)
    return out


async def assert_never_recovered(db: Store, recovery: Recovery, *ids: uuid.UUID) -> None:
    """A crash during a durable wait needs no recovery: nothing held a lease."""
    assert recovery.ticks > 0
    for ident in ids:
        e = await get(db, ident)
        assert not recovery.touched(ident), f"recovery touched {ident}"
        assert e.attempt == 1, (ident, e.attempt)
        kinds = {ev.kind for ev in await history(db, ident)}
        assert Status.FAILED_TRANSIENT not in kinds, kinds
        assert all(c.get("attempt") == 1 for c in claims(await history(db, ident)))


async def assert_children_once(
    db: Store, url: str, parent: uuid.UUID, expected: Counter[tuple[str, str]]
) -> list[uuid.UUID]:
    """The parent's children, counted by parent_id: exactly ``expected`` (a Counter of
    (ffqn, JSON params as text)), each one the child its journal recorded, at a position of
    its own, and each created exactly once (one creation event each)."""
    rows = await children_rows(url, parent)
    got = Counter((ffqn, json.dumps(params, sort_keys=True)) for _, ffqn, params in rows)
    assert got == expected, (got, expected)
    events = await history(db, parent)
    submitted = of_kind(events, "child_submitted")
    positions = [e.data["pos"] for e in submitted if isinstance(e.data, dict)]
    assert len(positions) == len(set(positions)) == len(rows), positions
    recorded = {}
    for e in submitted:
        assert isinstance(e.data, dict)
        recorded[uuid.UUID(str(e.data["child_id"]))] = (
            e.data["ffqn"], json.dumps(e.data["params"], sort_keys=True))
    assert {i: (f, json.dumps(p, sort_keys=True)) for i, f, p in rows} == recorded
    for ident, _, _ in rows:
        child_events = await history(db, ident)
        creations = [e for e in child_events if e.seq == 1]
        assert [e.kind for e in creations] == ["pending"], creations
        assert isinstance(creations[0].data, dict)
        assert creations[0].data.get("parent_id") == str(parent)
    return [ident for ident, _, _ in rows]


def expect(*pairs: tuple[str, Any]) -> Counter[tuple[str, str]]:
    return Counter((ffqn, json.dumps(params, sort_keys=True)) for ffqn, params in pairs)


# -- 1. kill -9 during a durable sleep --------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("restart", ["before_wake", "after_wake"])
async def test_kill9_during_a_sleep(
    database_url: str, db: Store, procs: Processes, recovery: Recovery, restart: str
) -> None:
    """``before_wake``: the new worker is up before the wake time; ``after_wake``: the wake
    time passes while no worker runs at all."""
    w1 = start_worker(procs, database_url)
    await registered(w1)
    ex = await submit(db, SLEEP, 1.5)

    asleep = await blocked(db, recovery, ex)
    events = await history(db, ex)
    [now_ev] = of_kind(events, "now_recorded")
    [sleep_ev] = of_kind(events, "sleep_started")
    assert isinstance(now_ev.data, dict) and isinstance(sleep_ev.data, dict)
    until = datetime.fromisoformat(str(sleep_ev.data["until"]))
    assert asleep.wake_at is not None
    assert abs((asleep.wake_at - until).total_seconds()) < 0.001

    w1.kill9()
    assert w1.returncode == -9
    # the kill landed during the sleep, and the sleep is still all there is
    assert await db.db_now() < until, "the worker was killed after the wake time"
    after_kill = await get(db, ex)
    assert (after_kill.status, after_kill.lease_owner) == (Status.BLOCKED, None)

    if restart == "after_wake":
        async def due() -> bool:
            await recovery.tick()
            return await db.db_now() > until

        await wait_until(due, 10, interval=0.1, what="the wake time")
        still = await get(db, ex)  # nobody wakes it but a worker
        assert (still.status, still.lease_owner) == (Status.BLOCKED, None)
    w2 = start_worker(procs, database_url)
    w2_id, = await registered(w2)
    done = await wait_status(db, recovery, ex, Status.COMPLETED, timeout=20)

    before = datetime.fromisoformat(str(now_ev.data["value"]))
    assert done.result == f"slept since {before.isoformat()}"
    events = await history(db, ex)
    assert len(of_kind(events, "sleep_started")) == 1
    assert len(of_kind(events, "now_recorded")) == 1
    [completed] = of_kind(events, "completed")
    assert completed.at >= until, (completed.at, until)
    runs = claims(events)
    assert len(runs) == 2 and runs[1]["owner"] == w2_id, runs
    woken = [e for e in of_kind(events, "pending")
             if isinstance(e.data, dict) and e.data.get("reason") == "timer"]
    assert len(woken) == 1 and woken[0].at >= until
    await assert_never_recovered(db, recovery, ex)


# -- 2. kill -9 while waiting for children ----------------------------------------------------


@pytest.mark.timeout(60)
async def test_kill9_while_a_parent_waits_for_pending_children(
    database_url: str, db: Store, procs: Processes, recovery: Recovery
) -> None:
    """A worker that runs parents only leaves the (fast) echo children pending, so the
    parent is surely blocked on its join set when the worker dies."""
    values = ["a", "b", "c"]
    w1 = start_worker(procs, database_url, parents_only=True)
    await registered(w1)
    ex = await submit(db, PARENT, values)

    await blocked(db, recovery, ex)
    submitted = of_kind(await history(db, ex), "child_submitted")
    assert len(submitted) == 3
    kids = await children_rows(database_url, ex)
    assert [(await get(db, k)).status for k, _, _ in kids] == [Status.PENDING] * 3

    w1.kill9()
    parent = await get(db, ex)
    assert (parent.status, parent.lease_owner) == (Status.BLOCKED, None)

    w2 = start_worker(procs, database_url)
    await registered(w2)
    done = await wait_status(db, recovery, ex, Status.COMPLETED)

    assert isinstance(done.result, list) and sorted(done.result) == values
    child_ids = await assert_children_once(
        db, database_url, ex, expect(*((ECHO, [v]) for v in values)))
    events = await history(db, ex)
    joined = [e.data["child_id"] for e in of_kind(events, "join_next")
              if isinstance(e.data, dict)]
    assert sorted(joined) == sorted(str(i) for i in child_ids)
    for child in child_ids:
        c = await get(db, child)
        assert c.status == Status.COMPLETED
        assert len(claims(await history(db, child))) == 1  # ran once, on w2
    await assert_never_recovered(db, recovery, ex, *child_ids)


@pytest.mark.timeout(60)
async def test_kill9_while_a_three_level_tree_waits_for_messages(
    database_url: str, db: Store, procs: Processes, recovery: Recovery
) -> None:
    """top -> (mid -> waiter, waiter-direct): every level blocked when the worker dies; the
    leaves are released by messages, one sent while no worker runs, one after restart."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    w1 = start_worker(procs, database_url)
    await registered(w1)
    top = await submit(db, TOP, topic)

    await blocked(db, recovery, top)

    async def tree() -> tuple[uuid.UUID, uuid.UUID, uuid.UUID] | None:
        found, _ = await db.execution_children(top)
        kids = {e.ffqn: e.id for e in found}
        if set(kids) != {MID, WAITER}:
            return None
        grandkids = [e.id for e in (await db.execution_children(kids[MID]))[0]]
        if len(grandkids) != 1:
            return None
        for ident in (kids[MID], kids[WAITER], grandkids[0]):
            e = await get(db, ident)
            if e.status != Status.BLOCKED or e.lease_owner is not None:
                return None
        for leaf in (kids[WAITER], grandkids[0]):
            if not of_kind(await history(db, leaf), "recv_started"):
                return None
        return kids[MID], kids[WAITER], grandkids[0]

    found = await recovery.until(tree, 20, "the whole tree to be blocked")
    mid, direct, deep = found

    w1.kill9()
    for ident in (top, mid, direct, deep):
        e = await get(db, ident)
        assert (e.status, e.lease_owner) == (Status.BLOCKED, None), (ident, e.status)

    sent = await db.message_send(direct, topic + "-direct", "direct payload")
    assert sent.message is not None and sent.refused is None
    w2 = start_worker(procs, database_url)
    await registered(w2)
    sent = await db.message_send(deep, topic, {"deep": [1, 2]})
    assert sent.message is not None and sent.refused is None

    done = await wait_status(db, recovery, top, Status.COMPLETED)
    assert isinstance(done.result, list)
    assert sorted(map(str, done.result)) == sorted(["direct payload", str({"deep": [1, 2]})])
    assert await count_all(database_url) == 4
    await assert_children_once(db, database_url, top,
                               expect((MID, [topic]), (WAITER, [topic + "-direct"])))
    await assert_children_once(db, database_url, mid, expect((WAITER, [topic])))
    for leaf in (direct, deep):
        assert len(of_kind(await history(db, leaf), "message_received")) == 1
    for ident in (top, mid, direct, deep):
        assert (await get(db, ident)).status == Status.COMPLETED
    await assert_never_recovered(db, recovery, top, mid, direct, deep)


# -- 3. kill -9 while waiting for a message ---------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("send", ["before_restart", "after_restart"])
async def test_kill9_while_waiting_for_a_message(
    database_url: str, db: Store, procs: Processes, recovery: Recovery, send: str
) -> None:
    topic = "orders"
    first: JSON = {"n": 1, "s": "first"}
    w1 = start_worker(procs, database_url)
    await registered(w1)
    ex = await submit(db, RECV, topic)

    await blocked(db, recovery, ex)
    [started] = of_kind(await history(db, ex), "recv_started")
    assert isinstance(started.data, dict) and started.data["topic"] == topic
    w1.kill9()

    async def send_two() -> list[int]:
        ids: list[int] = []
        for payload in (first, "second"):
            sent = await db.message_send(ex, topic, payload)
            assert sent.message is not None and sent.refused is None, sent
            ids.append(sent.message.id)
        return ids

    if send == "before_restart":
        message_ids = await send_two()
        woken = await get(db, ex)
        assert (woken.status, woken.lease_owner) == (Status.PENDING, None)
        w2 = start_worker(procs, database_url)
        await registered(w2)
    else:
        w2 = start_worker(procs, database_url)
        await registered(w2)
        still = await get(db, ex)
        assert (still.status, still.lease_owner) == (Status.BLOCKED, None)
        message_ids = await send_two()

    done = await wait_status(db, recovery, ex, Status.COMPLETED)
    assert done.result == first
    events = await history(db, ex)
    [received] = of_kind(events, "message_received")
    assert isinstance(received.data, dict)
    assert received.data["payload"] == first
    assert received.data["message_id"] == message_ids[0]
    assert received.data["pos"] == started.data["pos"]
    rows = await sql(
        database_url,
        "SELECT id, consumed_at IS NOT NULL, consumed_pos FROM veracity_messages"
        " WHERE execution_id = %s ORDER BY id",
        "SELECT id, consumed_at IS NOT NULL, consumed_pos FROM veracity_messages"
        " WHERE execution_id = ? ORDER BY id",
        [ex],
    )
    assert [(int(i), bool(c), p) for i, c, p in rows] == [
        (message_ids[0], True, started.data["pos"]), (message_ids[1], False, None)]
    await assert_never_recovered(db, recovery, ex)


# -- 4. kill -9 between a child's creation and the parent's next step -------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("child", ["child_pending", "child_finished"])
async def test_kill9_between_child_creation_and_the_parents_next_step(
    database_url: str, db: Store, procs: Processes, recovery: Recovery, child: str
) -> None:
    """Deterministic: a fault in the database refuses the parent's next journal write after
    it created its child (the worker retries it under a valid lease), so the kill lands in
    that window every time. ``child_pending``: a parents-only worker, the child has not
    run; ``child_finished``: the child ran to completion on the dying worker."""
    value: JSON = {"v": 1}
    ex = await submit(db, CALL, value)
    await hold_after_child(database_url, ex)
    w1 = start_worker(procs, database_url, parents_only=child == "child_pending")
    w1_id, = await registered(w1)

    async def created() -> list[HistoryEvent] | None:
        events = of_kind(await history(db, ex), "child_submitted")
        if not events:
            return None
        if child == "child_finished":
            kids = await children_rows(database_url, ex)
            if not kids or (await get(db, kids[0][0])).status != Status.COMPLETED:
                return None
        return events

    [submitted] = await recovery.until(created, 20, "the child's creation")
    assert isinstance(submitted.data, dict)
    await asyncio.sleep(0.5)  # the held write has been tried (and refused) by now
    w1.kill9()

    # the crash landed in the window: the child and its record exist, nothing after them
    parent = await get(db, ex)
    assert (parent.status, parent.lease_owner, parent.attempt) == (Status.RUNNING, w1_id, 1)
    kinds = [e.kind for e in await history(db, ex)]
    assert kinds[-1] == "child_submitted", kinds
    assert "join_next" not in kinds and "blocked" not in kinds, kinds
    kids = await children_rows(database_url, ex)
    assert [k[0] for k in kids] == [uuid.UUID(str(submitted.data["child_id"]))]
    expected_child = Status.COMPLETED if child == "child_finished" else Status.PENDING
    assert (await get(db, kids[0][0])).status == expected_child

    await release_hold(database_url)
    recovered = await wait_status(db, recovery, ex, Status.PENDING, timeout=15)
    assert recovered.attempt == 2 and recovery.retried.count(str(ex)) == 1
    assert not recovery.failed

    w2 = start_worker(procs, database_url)
    w2_id, = await registered(w2)
    done = await wait_status(db, recovery, ex, Status.COMPLETED)
    assert done.result == value and done.attempt == 2

    [kid] = await assert_children_once(db, database_url, ex, expect((ECHO, [value])))
    events = await history(db, ex)
    [again] = of_kind(events, "child_submitted")  # none written at the same pos on replay
    assert again.data == submitted.data
    assert len(of_kind(events, "join_next")) == 1
    # w2 may claim it twice (blocked on the join, then woken by the child's end): attempt 2
    runs = [(c["owner"], c["attempt"]) for c in claims(events)]
    assert runs[0] == (w1_id, 1) and set(runs[1:]) == {(w2_id, 2)}, runs
    c = await get(db, kid)
    assert (c.status, c.result, c.attempt) == (Status.COMPLETED, value, 1)
    child_runs = claims(await history(db, kid))
    assert [r["owner"] for r in child_runs] == [w1_id if child == "child_finished" else w2_id]


@pytest.mark.timeout(90)
async def test_kill9_between_child_creation_and_the_parents_next_step_natural_race(
    database_url: str, db: Store, procs: Processes, recovery: Recovery
) -> None:
    """The same window without any fault injected: poll the parent's history as fast as
    possible and kill -9 as soon as a child is recorded while the parent still runs and has
    not joined. Rounds that come too late are retried with a fresh parent; the window must
    be hit at least once. Whatever the round, no child is lost or doubled."""
    values = [f"v{i:02d}" for i in range(8)]
    max_rounds = 6
    parents: list[uuid.UUID] = []
    hits: list[tuple[uuid.UUID, int, str]] = []
    for _ in range(max_rounds):
        w = start_worker(procs, database_url)
        w_id, = await registered(w)
        ex = await submit(db, PARENT, values)
        parents.append(ex)
        deadline = time.monotonic() + 15
        while True:
            kinds = [e.kind for e in await history(db, ex)]
            if "child_submitted" in kinds or "join_next" in kinds or "completed" in kinds:
                w.kill9()
                break
            assert time.monotonic() < deadline, f"no child recorded: {kinds}\n{w.describe()}"
            await asyncio.sleep(0)
        # what the crash left (the worker is gone: this is final until recovery)
        events = await history(db, ex)
        kinds = [e.kind for e in events]
        parent = await get(db, ex)
        submitted = len(of_kind(events, "child_submitted"))
        if (parent.status == Status.RUNNING and parent.lease_owner == w_id and submitted
                and kinds[-1] == "child_submitted" and "join_next" not in kinds):
            hits.append((ex, submitted, w_id))
            assert len(await children_rows(database_url, ex)) == submitted
            break
    assert hits, f"the window was never hit in {max_rounds} rounds"
    print(f"window hit in round {len(parents)} of {max_rounds}, after "
          f"{hits[0][1]} of {len(values)} children")

    w = start_worker(procs, database_url)
    await registered(w)
    for ex in parents:
        done = await wait_status(db, recovery, ex, Status.COMPLETED, timeout=30)
        assert isinstance(done.result, list) and sorted(done.result) == values
        await assert_children_once(db, database_url, ex,
                                   expect(*((ECHO, [v]) for v in values)))
    hit, _, killed = hits[0]
    # recovered once: by the test's recovery or by the new worker's own (every worker runs
    # lease recovery), whichever ticked first; never failed
    recovered = [e for e in await history(db, hit) if e.kind == "pending"
                 and isinstance(e.data, dict) and e.data.get("reason") == "lease expired"]
    assert (await get(db, hit)).attempt == 2
    assert [e.data["owner"] for e in recovered] == [killed]
    assert not recovery.failed


@pytest.mark.timeout(60)
async def test_kill9_between_schedule_and_the_workflows_next_step(
    database_url: str, db: Store, procs: Processes, recovery: Recovery
) -> None:
    """``ctx.schedule`` creates a top-level execution in the same transaction as its record:
    a crash after it (the completion held, then kill -9) and a replay create it once."""
    ex = await submit(db, SCHEDULE, "hello")
    await hold_writes(database_url, ex, ["completed"])
    w1 = start_worker(procs, database_url)
    w1_id, = await registered(w1)

    async def scheduled() -> list[HistoryEvent] | None:
        return of_kind(await history(db, ex), "scheduled") or None

    [record] = await recovery.until(scheduled, 20, "the schedule's record")
    assert isinstance(record.data, dict)
    scheduled_id = uuid.UUID(str(record.data["execution_id"]))
    await wait_status(db, recovery, scheduled_id, Status.COMPLETED)  # w1 ran it
    await asyncio.sleep(0.3)
    w1.kill9()
    parent = await get(db, ex)
    assert (parent.status, parent.lease_owner) == (Status.RUNNING, w1_id)

    await release_hold(database_url)
    await wait_status(db, recovery, ex, Status.PENDING, timeout=15)
    w2 = start_worker(procs, database_url)
    await registered(w2)
    done = await wait_status(db, recovery, ex, Status.COMPLETED)
    assert done.result == str(scheduled_id) and done.attempt == 2
    assert len(of_kind(await history(db, ex), "scheduled")) == 1
    rows = await sql(
        database_url,
        "SELECT id, parent_id FROM veracity_executions WHERE ffqn = %s",
        "SELECT id, parent_id FROM veracity_executions WHERE ffqn = ?",
        [ECHO],
    )
    assert [(uuid.UUID(str(i)), p) for i, p in rows] == [(scheduled_id, None)]
    assert await count_all(database_url) == 2
    assert len(claims(await history(db, scheduled_id))) == 1


# -- 5. graceful restart mid-join --------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("moment", ["submitting", "joining"])
async def test_sigterm_mid_join_then_a_new_worker_finishes(
    database_url: str, db: Store, procs: Processes, recovery: Recovery, moment: str
) -> None:
    """``submitting``: SIGTERM as soon as the parent recorded its first child, while it is
    still submitting the rest: it stops at its next step boundary and is released (pending).
    ``joining``: a parents-only worker, the parent is blocked on its join set: it stays
    blocked. Either way the worker exits 0, holds nothing, and a new worker finishes."""
    values = [f"v{i:02d}" for i in range(24)]  # a wide window for SIGTERM
    w1 = start_worker(procs, database_url, parents_only=moment == "joining")
    await registered(w1)
    ex = await submit(db, PARENT, values)

    if moment == "joining":
        await blocked(db, recovery, ex)
    else:
        async def first_child() -> bool:
            return bool(of_kind(await history(db, ex), "child_submitted"))

        await wait_until(first_child, 20, interval=0.001, what="the first child",
                         describe=procs.describe)
    w1.terminate()
    assert await w1.wait(15) == 0, w1.describe()

    parent = await get(db, ex)
    assert parent.lease_owner is None and parent.lease_expires_at is None
    events = await history(db, ex)
    if moment == "joining":
        assert parent.status == Status.BLOCKED
        assert len(of_kind(events, "child_submitted")) == len(values)
    else:
        assert parent.status == Status.PENDING, (parent.status, [e.kind for e in events])
        last = events[-1]
        assert last.kind == "pending" and isinstance(last.data, dict)
        assert last.data["reason"] == SHUTDOWN_REASON
        assert "join_next" not in [e.kind for e in events]
    submitted_at_stop = len(of_kind(events, "child_submitted"))
    assert len(await children_rows(database_url, ex)) == submitted_at_stop

    w2 = start_worker(procs, database_url)
    await registered(w2)
    done = await wait_status(db, recovery, ex, Status.COMPLETED)
    assert isinstance(done.result, list) and sorted(done.result) == values
    child_ids = await assert_children_once(db, database_url, ex,
                                           expect(*((ECHO, [v]) for v in values)))
    await assert_never_recovered(db, recovery, ex, *child_ids)
    assert not recovery.retried and not recovery.failed

