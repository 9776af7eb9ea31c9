"""A write whose answer is lost after its commit (the connection dies between the COMMIT
and its reply) is in doubt: the run cannot tell whether it landed. Writing it again must not
record anything twice: before a retry, the Context looks in the history for what it wrote
(docs/workers.md, "Writes whose answer was lost").

Each test wraps a real store (both backends) so that one chosen write really commits and
then raises the error a lost answer raises, once; the run's history is then checked.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests._helpers import clocked_store_fixture, history, store_fixture, wait_status
from tests.durable._support import SETTINGS, running
from veracity import App
from veracity.core.states import Status
from veracity.models import Claim, Execution, HistoryEvent, NewExecution
from veracity.store import Store
from veracity.worker.context import (
    MESSAGE_RECEIVED,
    STEP_COMPLETED,
    Context,
    ExecutionSuspended,
)
from veracity.worker.runner import Worker

TTL = timedelta(seconds=30)
FFQN = "test:doubt/run.fn"
OWNER = "worker-doubt"

store = clocked_store_fixture(pool_size=2)


class LostAnswers:
    """The store, except that the next call of each method in ``lose`` commits and then
    fails as a connection dying after its commit would."""

    def __init__(self, inner: Store, *lose: str) -> None:
        self.inner = inner
        self.lose = set(lose)
        self.lost: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.lose:
            return attr

        async def committed_then_lost(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            if name in self.lose:
                self.lose.discard(name)
                self.lost.append(name)
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return result

        return committed_then_lost


async def claimed(store: Store) -> tuple[Execution, Claim]:
    new = NewExecution(ffqn=FFQN, params=[], deployment_id="d-doubt", id=uuid.uuid4())
    await store.execution_submit(new)
    (ex,) = await store.execution_claim(OWNER, [FFQN], limit=1, lease_ttl=TTL)
    return ex, Claim(ex.id, OWNER, ex.lease_epoch)


def context(wrapped: LostAnswers, ex: Execution, claim: Claim, **kw: Any) -> Context:
    return Context(store=wrapped, claim=claim, execution_id=ex.id,
                   deployment_id=ex.deployment_id, attempt=ex.attempt,
                   clock_base=ex.updated_at, claimed_seq=ex.history_seq, **kw)


def journal_positions(events: list[HistoryEvent], kind: str) -> Counter[Any]:
    return Counter(e.data.get("pos") for e in events if e.kind == kind
                   and isinstance(e.data, dict))


async def test_a_step_checkpoint_is_recorded_once(store: Store) -> None:
    ex, claim = await claimed(store)
    wrapped = LostAnswers(store, "execution_checkpoint_if_owned")
    ctx = context(wrapped, ex, claim)

    async def work() -> int:
        return 42

    assert await ctx.step(work) == 42
    assert await ctx.step(work) == 42
    assert wrapped.lost == ["execution_checkpoint_if_owned"]
    events = await history(store, ex.id)
    assert journal_positions(events, STEP_COMPLETED) == {0: 1, 1: 1}


async def test_the_worker_batched_checkpoint_is_recorded_once(store: Store) -> None:
    ex, claim = await claimed(store)
    wrapped = LostAnswers(store, "execution_checkpoint_many_if_owned")

    async def batched(c: Claim, kind: str, data: Any) -> Any:
        (outcome,) = await wrapped.execution_checkpoint_many_if_owned(OWNER, [(c, kind, data)])
        return outcome

    ctx = context(wrapped, ex, claim, checkpoint=batched)

    async def work() -> str:
        return "done"

    assert await ctx.step(work) == "done"
    assert wrapped.lost == ["execution_checkpoint_many_if_owned"]
    events = await history(store, ex.id)
    assert journal_positions(events, STEP_COMPLETED) == {0: 1}


async def test_a_message_taken_is_that_message_not_the_next(store: Store) -> None:
    ex, claim = await claimed(store)
    for payload in ("first", "second"):
        sent = await store.message_send(ex.id, "approval", payload)
        assert sent.refused is None
    wrapped = LostAnswers(store, "execution_take_message_if_owned")
    ctx = context(wrapped, ex, claim)

    assert await ctx.recv("approval") == "first"
    assert wrapped.lost == ["execution_take_message_if_owned"]
    events = await history(store, ex.id)
    received = [e.data["payload"] for e in events if e.kind == MESSAGE_RECEIVED
                and isinstance(e.data, dict)]
    assert received == ["first"]
    # the second message is still there for the next recv
    assert await ctx.recv("approval") == "second"


async def test_a_durable_wait_is_entered_once_without_a_late_report(store: Store) -> None:
    ex, claim = await claimed(store)
    wrapped = LostAnswers(store, "execution_block_if_owned")
    ctx = context(wrapped, ex, claim)

    with pytest.raises(ExecutionSuspended):
        await ctx.sleep(3600)
    assert wrapped.lost == ["execution_block_if_owned"]
    events = await history(store, ex.id)
    kinds = [e.kind for e in events]
    assert kinds.count("blocked") == 1, kinds
    assert "late_report" not in kinds, kinds
    assert journal_positions(events, "sleep_started") == {0: 1}
    got = await store.execution_get(ex.id)
    assert got is not None and str(got.status) == "blocked"


async def test_a_child_and_its_record_are_written_once(store: Store) -> None:
    ex, claim = await claimed(store)
    wrapped = LostAnswers(store, "execution_spawn_if_owned")
    ctx = context(wrapped, ex, claim)

    js = ctx.join_set()
    child = await js.submit("test:doubt/child.fn", 1)
    assert wrapped.lost == ["execution_spawn_if_owned"]
    events = await history(store, ex.id)
    assert journal_positions(events, "child_submitted") == {0: 1}
    children, _ = await store.execution_children(ex.id)
    assert [c.id for c in children] == [child]


# -- the worker's own exits ---------------------------------------------------------------

live_store = store_fixture(pool_size=4, name="live_store")
app = App("doubt")


@app.workflow("test:doubt/steps.fn")
async def steps(ctx: Context, n: int) -> list[int]:
    async def square(i: int) -> int:
        return i * i

    return [await ctx.step(square, i) for i in range(n)]


@pytest.mark.parametrize("lost", ["execution_complete_many_if_owned",
                                  "execution_checkpoint_many_if_owned"])
async def test_a_workers_lost_answers_record_nothing_twice(live_store: Store, lost: str
                                                           ) -> None:
    wrapped = LostAnswers(live_store, lost)
    worker = Worker(wrapped, app, settings=SETTINGS,
                    deployment_id="d-doubt")
    new = NewExecution(ffqn="test:doubt/steps.fn", params=[3], deployment_id="d-doubt",
                       id=uuid.uuid4())
    await live_store.execution_submit(new)
    async with running(worker):
        done = await wait_status(live_store, new.id, Status.COMPLETED, Status.FAILED)
    assert wrapped.lost == [lost]
    assert (done.status, done.result) == (Status.COMPLETED, [0, 1, 4]), done.error
    events = await history(live_store, new.id)
    kinds = [e.kind for e in events]
    assert kinds.count("completed") == 1 and "late_report" not in kinds, kinds
    assert journal_positions(events, STEP_COMPLETED) == {0: 1, 1: 1, 2: 1}
