"""Hand-offs to an idle worker (docs/workers.md, "Hand-off to an idle worker"): on
PostgreSQL an idle worker offers to take the next submission, which is written claimed
by it and heard on its own channel, so that it starts without a claim. Workers run
in-process against a real store here (a worker killed with -9 while its offer is out:
real processes, at the end). SQLite has no hand-offs: there the same submission is
claimed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests._helpers import history, store_fixture, until, wait_status
from tests.worker._procs import Processes, wait_until
from veracity import App, Context
from veracity._ids import new_execution_id
from veracity.config import WorkerSettings
from veracity.core.states import Status
from veracity.models import Execution, NewExecution
from veracity.store import Store
from veracity.worker import runner
from veracity.worker.runner import Worker

SETTINGS = WorkerSettings(lease_ttl=5, heartbeat_interval=0.5, poll_interval=5,
                          concurrency=4, shutdown_grace=1)
"""Polls 5 s apart: a worker posts its offer again at each poll, and a submission that
comes while that write holds the offer's row goes by the usual way (pending, claimed);
rare, but not what these tests look at. Hand-offs and pending notifications wake it."""
DEPLOYMENT = "dep-handoff-tests"
app = App("handoff-tests")
GATES: dict[str, asyncio.Event] = {}
RUNNING = {"now": 0, "max": 0}


@app.workflow("ht:echo/run.fn")
async def echo(ctx: Context, value: Any) -> Any:
    return value


@app.workflow("ht:gated/run.fn")
async def gated(ctx: Context, key: str) -> str:
    RUNNING["now"] += 1
    RUNNING["max"] = max(RUNNING["max"], RUNNING["now"])
    try:
        await GATES.setdefault(key, asyncio.Event()).wait()
    finally:
        RUNNING["now"] -= 1
    return key


@pytest.fixture(autouse=True)
def state() -> None:
    GATES.clear()
    RUNNING.update(now=0, max=0)


store = store_fixture(pool_size=4)


async def submit(store: Store, ffqn: str, *params: Any) -> Execution:
    return (await store.execution_submit(NewExecution(
        ffqn=ffqn, params=list(params), deployment_id=DEPLOYMENT,
        id=new_execution_id()))).execution


def offers(database_url: str) -> list[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT owner FROM veracity_offers").fetchall()]


async def offered(database_url: str, worker: Worker) -> None:
    async def check() -> bool:
        return worker.id in offers(database_url)

    await until(check, what=f"{worker.id} to post its offer")


def handed_flags(events: Sequence[Any]) -> list[bool]:
    return [bool(ev.data.get("handoff")) for ev in events if ev.kind == "running"]


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[None]:
    task = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=10)


POSTGRESQL = pytest.mark.parametrize("backend", ["postgresql"])
"""Hand-offs are PostgreSQL's: these tests run on it alone (on SQLite the same submission
is claimed: test_an_idle_worker_starts_a_submission)."""


async def test_an_idle_worker_starts_a_submission(database_url: str, store: Store) -> None:
    worker = Worker(store, app, settings=SETTINGS, deployment_id=DEPLOYMENT)
    async with running(worker):
        if store.supports_handoff:
            await offered(database_url, worker)
        execution = await submit(store, "ht:echo/run.fn", {"a": [1, 2]})
        done = await wait_status(store, execution.id, Status.COMPLETED)
    assert done.result == {"a": [1, 2]}
    events = await history(store, execution.id)
    assert [ev.kind for ev in events] == ["pending", "running", "completed"]
    if store.supports_handoff:
        # written claimed by the worker at submission: it ran without a claim
        assert execution.status is Status.RUNNING and execution.lease_owner == worker.id
        assert handed_flags(events) == [True]
        assert worker.handed_total == 1
    else:
        assert execution.status is Status.PENDING
        assert handed_flags(events) == [False]
        assert worker.handed_total == 0


@POSTGRESQL
async def test_a_worker_hands_off_one_after_another(database_url: str, store: Store) -> None:
    worker = Worker(store, app, settings=SETTINGS, deployment_id=DEPLOYMENT)
    async with running(worker):
        ids = []
        for i in range(5):
            await offered(database_url, worker)  # posted again after each hand-off
            ids.append((await submit(store, "ht:echo/run.fn", i)).id)
            await wait_status(store, ids[-1], Status.COMPLETED)
    assert worker.handed_total == 5
    for ident in ids:
        assert handed_flags(await history(store, ident)) == [True]


@POSTGRESQL
async def test_no_offer_with_handoff_turned_off(database_url: str, store: Store) -> None:
    settings = SETTINGS.model_copy(update={"handoff": False, "poll_interval": 0.2})
    worker = Worker(store, app, settings=settings, deployment_id=DEPLOYMENT)
    async with running(worker):
        await until(lambda: _registered(store, worker), what="the worker to register")
        await asyncio.sleep(3 * settings.poll_interval)  # three polls, and no offer
        assert offers(database_url) == []
        execution = await submit(store, "ht:echo/run.fn", 1)
        assert execution.status is Status.PENDING
        await wait_status(store, execution.id, Status.COMPLETED)
    assert handed_flags(await history(store, execution.id)) == [False]


async def _registered(store: Store, worker: Worker) -> bool:
    return any(w.id == worker.id for w in await store.worker_list())


@POSTGRESQL
async def test_a_stopped_worker_leaves_no_offer(database_url: str, store: Store) -> None:
    worker = Worker(store, app, settings=SETTINGS, deployment_id=DEPLOYMENT)
    async with running(worker):
        await offered(database_url, worker)
    assert offers(database_url) == []
    assert (await submit(store, "ht:echo/run.fn", 1)).status is Status.PENDING


class HeldHandoffs:
    """The worker's store, with the hand-offs it hears held back until ``release``: the
    notification of a taken offer still on its way while the worker claims."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def pending_notifications(self, handoff_to: str | None = None
                                    ) -> AsyncIterator[Execution | None]:
        async for note in self._store.pending_notifications(handoff_to=handoff_to):
            if note is not None:
                self.held.set()
                await self.release.wait()
            yield note


@POSTGRESQL
async def test_a_slot_is_kept_for_a_taken_offer_not_heard_yet(
    database_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrency 1: an offer taken while the worker is woken to claim. The worker learns
    it was taken when it withdraws it, and claims nothing until the hand-off arrives: never
    two at once. (The slot is kept for up to HANDOFF_GRACE, made long here so that a slow
    machine cannot end it before the test releases the hand-off.)"""
    monkeypatch.setattr(runner, "HANDOFF_GRACE", 30.0)
    held = HeldHandoffs(store)
    settings = SETTINGS.model_copy(update={"concurrency": 1})
    worker = Worker(held, app, settings=settings, deployment_id=DEPLOYMENT)
    async with running(worker):
        await offered(database_url, worker)
        first = await submit(store, "ht:gated/run.fn", "first")
        assert first.status is Status.RUNNING  # taken; the worker has not heard it
        await asyncio.wait_for(held.held.wait(), 5)
        second = await submit(store, "ht:gated/run.fn", "second")  # pending: wakes it
        assert second.status is Status.PENDING
        await asyncio.sleep(0.5)
        assert (await store.execution_get(second.id)).status is Status.PENDING  # type: ignore[union-attr]
        assert RUNNING["max"] == 0
        held.release.set()
        await until(lambda: _is(RUNNING["now"] == 1), what="the handed one to run")
        GATES.setdefault("first", asyncio.Event()).set()
        await wait_status(store, first.id, Status.COMPLETED)
        await wait_status(store, second.id, Status.RUNNING)
        GATES.setdefault("second", asyncio.Event()).set()
        await wait_status(store, second.id, Status.COMPLETED)
    assert RUNNING["max"] == 1
    assert handed_flags(await history(store, first.id)) == [True]
    assert handed_flags(await history(store, second.id)) == [False]


async def _is(value: bool) -> bool:
    return value


@POSTGRESQL
async def test_a_busy_worker_offers_only_a_free_slot(
    database_url: str, store: Store
) -> None:
    """Concurrency 2: with one running, one slot is free and offered; with two, none."""
    settings = SETTINGS.model_copy(update={"concurrency": 2})
    worker = Worker(store, app, settings=settings, deployment_id=DEPLOYMENT)
    async with running(worker):
        await offered(database_url, worker)
        a = await submit(store, "ht:gated/run.fn", "a")
        await until(lambda: _is(RUNNING["now"] == 1), what="a to run")
        await offered(database_url, worker)  # the second slot
        b = await submit(store, "ht:gated/run.fn", "b")
        assert b.status is Status.RUNNING
        await until(lambda: _is(RUNNING["now"] == 2), what="b to run")
        await asyncio.sleep(0.5)
        assert offers(database_url) == []  # full: nothing offered
        c = await submit(store, "ht:gated/run.fn", "c")
        assert c.status is Status.PENDING
        for key in "abc":
            GATES.setdefault(key, asyncio.Event()).set()
        for ex in (a, b, c):
            await wait_status(store, ex.id, Status.COMPLETED)
    assert RUNNING["max"] == 2


class HeldClaims:
    """The worker's store, with its claims held back while ``hold`` is set (until
    ``release``), and its claims and offer writes counted."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.claims = 0
        self.hold = False
        self.claiming = asyncio.Event()
        self.release = asyncio.Event()
        self.withdrawn = 0
        self.posted = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def execution_claim(self, *args: Any, **kwargs: Any) -> list[Execution]:
        self.claims += 1
        if self.hold:
            self.claiming.set()
            await self.release.wait()
        return await self._store.execution_claim(*args, **kwargs)

    async def offer_post(self, *args: Any, **kwargs: Any) -> Any:
        self.posted += 1
        return await self._store.offer_post(*args, **kwargs)

    async def offer_withdraw(self, *args: Any, **kwargs: Any) -> Any:
        self.withdrawn += 1
        return await self._store.offer_withdraw(*args, **kwargs)


@POSTGRESQL
async def test_a_handoff_heard_during_a_claim_leaves_the_next_offer_out(
    database_url: str, store: Store
) -> None:
    """Concurrency 2, one slot kept for the offer: a hand-off heard while the worker claims
    makes it post a new offer after that claim, and the offer stays out (no withdrawal to
    claim with the slot kept for it: the next submission is handed off too)."""
    held = HeldClaims(store)
    settings = SETTINGS.model_copy(update={"concurrency": 2})
    worker = Worker(held, app, settings=settings, deployment_id=DEPLOYMENT)
    async with running(worker):
        await offered(database_url, worker)
        await until(lambda: _is(worker._parked), what="the worker to wait with its offer out")
        held.hold = True
        worker.wake()  # a hint: it claims, and the claim is held
        await asyncio.wait_for(held.claiming.wait(), 5)
        a = await submit(store, "ht:gated/run.fn", "a")  # takes the offer still out
        assert a.status is Status.RUNNING
        await until(lambda: _is(RUNNING["now"] == 1), what="a to run")  # heard mid-claim
        held.hold = False
        posted = held.posted
        held.release.set()
        await until(lambda: _is(held.posted > posted and worker._parked),
                    what="a new offer, and the worker waiting with it out")
        assert held.withdrawn == 0
        assert offers(database_url) == [worker.id]
        b = await submit(store, "ht:gated/run.fn", "b")
        assert b.status is Status.RUNNING
        for key in "ab":
            GATES.setdefault(key, asyncio.Event()).set()
        for ex in (a, b):
            await wait_status(store, ex.id, Status.COMPLETED)
    assert handed_flags(await history(store, b.id)) == [True]


@POSTGRESQL
async def test_after_a_handoff_the_worker_offers_again_without_a_claim(
    database_url: str, store: Store
) -> None:
    """Its last claim left nothing due and no hint came since: a hand-off wakes the worker
    to offer its free slot again, with no claim in between (one statement fewer for each
    execution handed off); it still claims at each poll."""
    held = HeldClaims(store)
    worker = Worker(held, app, settings=SETTINGS, deployment_id=DEPLOYMENT)
    loop = asyncio.get_running_loop()
    async with running(worker):
        await offered(database_url, worker)
        await until(lambda: _is(worker._parked), what="the worker to wait with its offer out")
        claims, started = held.claims, loop.time()
        for i in range(5):
            await offered(database_url, worker)
            execution = await submit(store, "ht:echo/run.fn", i)
            assert execution.status is Status.RUNNING
            await wait_status(store, execution.id, Status.COMPLETED)
        # the polls due meanwhile (the first may come at once: it is counted from the
        # claim before `started`)
        polls = int((loop.time() - started) / SETTINGS.poll_interval) + 1
        assert held.claims - claims <= polls  # a claim after each hand-off would be 5
    assert worker.handed_total == 5


@POSTGRESQL
async def test_hand_offs_one_after_another_leave_the_polls_to_claim_what_comes_due(
    database_url: str, store: Store
) -> None:
    """An execution scheduled a moment ahead becomes due without a notification; the
    worker, handed a submission every 50 ms meanwhile (and offering again after each without
    a claim), still claims it at its next poll."""
    settings = SETTINGS.model_copy(update={"poll_interval": 0.5})
    worker = Worker(store, app, settings=settings, deployment_id=DEPLOYMENT)
    async with running(worker):
        await offered(database_url, worker)
        later = (await store.execution_submit(NewExecution(
            ffqn="ht:echo/run.fn", params=["later"], deployment_id=DEPLOYMENT,
            id=new_execution_id(),
            scheduled_at=datetime.now(UTC) + timedelta(seconds=0.3)))).execution
        assert later.status is Status.PENDING
        handed = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while loop.time() < deadline:
            if (await store.execution_get(later.id)).status is Status.COMPLETED:  # type: ignore[union-attr]
                break
            handed += (await submit(store, "ht:echo/run.fn", "now")).status is Status.RUNNING
            await asyncio.sleep(0.05)
        await wait_status(store, later.id, Status.COMPLETED, timeout=0.1)
        assert handed > 0  # hand-offs went on meanwhile
    assert handed_flags(await history(store, later.id)) == [False]


@pytest.mark.timeout(60)
@POSTGRESQL
async def test_a_submission_handed_to_a_worker_killed_with_9_is_recovered(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    """The worker dies with its offer out; the next submission is written claimed by it
    (one execution per offer), and a live worker's recovery, seeing the process gone,
    gives it back at once (docs/workers.md, "A worker whose process is gone")."""
    env = {"VERACITY_LEASE_TTL": "60", "VERACITY_RECOVERY_INTERVAL": "0.3",
           "VERACITY_POLL_INTERVAL": "5"}  # its offer lives 6 s
    a = procs.worker(database_url, "A", env=env)
    a_id = await a.registered()
    await until(lambda: _is(a_id in offers(database_url)), what="A's offer")
    a.kill9()
    handed = (await store.execution_submit(NewExecution(
        ffqn="test:steps/run.fn", params=[str(tmp_path / "marks.txt"), 1, 0],
        deployment_id="d-test", id=new_execution_id()))).execution
    assert (handed.status, handed.lease_owner) == (Status.RUNNING, a_id)
    b = procs.worker(database_url, "B", env={**env, "VERACITY_POLL_INTERVAL": "0.2"})
    b_id = await b.registered()
    await wait_until(lambda: _done(store, handed.id), 30, what="B to run it",
                     describe=procs.describe)
    events = await history(store, handed.id)
    runs = [(ev.data.get("owner"), bool(ev.data.get("handoff")))
            for ev in events if ev.kind == "running"]
    assert runs[0] == (a_id, True)
    assert runs[-1][0] == b_id


async def _done(store: Store, ident: uuid.UUID) -> bool:
    e = await store.execution_get(ident)
    return e is not None and e.status is Status.COMPLETED


@POSTGRESQL
async def test_a_handoff_heard_while_stopping_is_given_back(
    database_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken just before the stopping worker withdrew its offer: the worker waits for it
    (up to HANDOFF_GRACE, long here) and releases it to pending, for another worker."""
    monkeypatch.setattr(runner, "HANDOFF_GRACE", 30.0)
    held = HeldHandoffs(store)
    worker = Worker(held, app, settings=SETTINGS, deployment_id=DEPLOYMENT)
    task = asyncio.create_task(worker.run())
    await offered(database_url, worker)
    taken = await submit(store, "ht:gated/run.fn", "taken")
    await asyncio.wait_for(held.held.wait(), 5)
    worker.stop()
    await asyncio.sleep(0.2)  # the offer withdrawn, found taken
    assert not task.done()  # waiting for the hand-off
    held.release.set()
    await asyncio.wait_for(task, 10)
    after = await store.execution_get(taken.id)
    assert after is not None
    assert (after.status, after.lease_owner) == (Status.PENDING, None)
    assert RUNNING["max"] == 0  # never started
    assert [ev.kind for ev in await history(store, taken.id)] == [
        "pending", "running", "pending"]


class LostHandoff:
    """The worker's store, whose listening connection is lost with the first hand-off on
    it: the notification never reaches the worker."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.lost: list[Execution] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def pending_notifications(self, handoff_to: str | None = None
                                    ) -> AsyncIterator[Execution | None]:
        async for note in self._store.pending_notifications(handoff_to=handoff_to):
            if note is not None and not self.lost:
                self.lost.append(note)
                raise ConnectionError("the listening connection was lost")
            yield note


@POSTGRESQL
async def test_a_handoff_whose_notification_was_lost_runs_when_the_worker_listens_again(
    database_url: str, store: Store
) -> None:
    """Its lease (60 s here) would have let it wait for recovery: the worker, listening
    again, finds what is leased to it and not running, and runs it."""
    lost = LostHandoff(store)
    settings = SETTINGS.model_copy(update={"lease_ttl": 60, "heartbeat_interval": 5})
    worker = Worker(lost, app, settings=settings, deployment_id=DEPLOYMENT)
    async with running(worker):
        await offered(database_url, worker)
        handed = await submit(store, "ht:echo/run.fn", "lost")
        assert handed.lease_owner == worker.id
        done = await wait_status(store, handed.id, Status.COMPLETED, timeout=5)
    assert [e.id for e in lost.lost] == [handed.id]
    assert done.result == "lost"
    events = await history(store, handed.id)
    assert [ev.kind for ev in events] == ["pending", "running", "completed"]


@pytest.mark.timeout(90)
@POSTGRESQL
async def test_many_submissions_to_idle_workers_run_once_each_within_the_concurrency(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    """Three `veracity worker` processes at concurrency 2, idle between bursts, and eight
    submitters at once: hand-offs and claims mix. Every execution runs once (one `running`
    event, one `completed`, no late report), and no process ever runs more than two
    workflows' code at once. (This found a worker that, refreshing an offer a submission
    had just taken, posted a new one: two hand-offs owed for one kept slot, and three
    running at once in two runs of three.)"""
    marks = tmp_path / "spans.txt"
    env = {"VERACITY_WORKER_CONCURRENCY": "2", "VERACITY_POLL_INTERVAL": "5"}
    workers = [procs.worker(database_url, name, env=env) for name in "ABC"]
    ids_of = [await w.registered() for w in workers]
    await until(lambda: _is(set(ids_of) <= set(offers(database_url))),
                what="three offers", timeout=15)

    async def submitter(k: int) -> list[uuid.UUID]:
        out = []
        for i in range(40):
            if i % 10 == 0:
                await asyncio.sleep(0.3)  # idle again: offers posted anew
            out.append((await store.execution_submit(NewExecution(
                ffqn="test:span/run.fn", params=[str(marks), 0.01], deployment_id="d-test",
                id=new_execution_id()))).execution.id)
        return out

    ids = [i for batch in await asyncio.gather(*(submitter(k) for k in range(8)))
           for i in batch]
    await wait_until(lambda: _all_done(store, ids), 60, what="all 320 completed",
                     describe=procs.describe)
    handed = 0
    for ident in ids:
        events = await history(store, ident)
        kinds = [ev.kind for ev in events]
        assert kinds == ["pending", "running", "completed"], (ident, kinds)
        handed += bool(events[1].data.get("handoff"))
    assert 0 < handed < len(ids)  # both ways were taken
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    for line in marks.read_text().splitlines():
        pid, step, _ = line.split()
        running[pid] = running.get(pid, 0) + int(step)
        most[pid] = max(most.get(pid, 0), running[pid])
    assert set(running.values()) == {0}
    assert max(most.values()) <= 2, most
    print(f"{handed} of {len(ids)} handed off; most at once per process: {most}")


async def _all_done(store: Store, ids: list[uuid.UUID]) -> bool:
    for ident in ids:
        e = await store.execution_get(ident)
        if e is None or e.status is not Status.COMPLETED:
            return False
    return True
