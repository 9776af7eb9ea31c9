"""Store conformance: hand-offs to idle workers (docs/workers.md, "Hand-off to an idle
worker"). On PostgreSQL a worker's offer makes the next matching submission be written
claimed by that worker, and the worker hears it with the row; SQLite has none (it has no
notifications), and says so."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from tests.store._support import RawSQL, StoreFactory, new_execution
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, Execution, NewExecution
from veracity.store import Store

TTL = timedelta(seconds=60)
POSTGRESQL = pytest.mark.parametrize("backend", ["postgresql"])
"""Hand-offs are PostgreSQL's: these tests run on it alone (SQLite's refusal:
test_sqlite_has_no_handoffs)."""
SQLITE = pytest.mark.parametrize("backend", ["sqlite"])
OFFER_FOR = timedelta(seconds=2)
FFQN = "app.handoff.run"
DEPLOYMENT = "dep-1"


async def offer(store: Store, owner: str = "w1", *, ffqns: tuple[str, ...] = (FFQN,),
                deployment_id: str = DEPLOYMENT) -> None:
    await store.offer_post(owner, deployment_id=deployment_id, ffqns=ffqns, lease_ttl=TTL,
                           expires_in=OFFER_FOR)


@pytest.fixture
async def heard(store: Store) -> AsyncIterator[asyncio.Queue[Execution | None]]:
    """What worker w1's listening connection hears (its hand-offs, and wake-ups)."""
    queue: asyncio.Queue[Execution | None] = asyncio.Queue()
    notes = store.pending_notifications(handoff_to="w1")
    assert await anext(notes) is None  # listening

    async def read() -> None:
        async for note in notes:
            queue.put_nowait(note)

    reader = asyncio.create_task(read())
    try:
        yield queue
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await notes.aclose()  # type: ignore[attr-defined]


async def next_handoff(queue: asyncio.Queue[Execution | None]) -> Execution:
    while True:
        note = await asyncio.wait_for(queue.get(), 5)
        if note is not None:
            return note


@SQLITE
async def test_sqlite_has_no_handoffs(store: Store) -> None:
    assert store.supports_handoff is False
    with pytest.raises(NotImplementedError, match="no hand-offs"):
        await offer(store)
    with pytest.raises(NotImplementedError, match="no hand-offs"):
        await store.offer_withdraw("w1")
    with pytest.raises(NotImplementedError, match="no hand-offs"):
        await store.offer_refresh("w1", expires_in=OFFER_FOR)
    submitted = await store.execution_submit(new_execution(FFQN))
    assert submitted.execution.status is Status.PENDING


@POSTGRESQL
async def test_a_submission_matching_an_offer_is_written_claimed_by_its_worker(
    store: Store, heard: asyncio.Queue[Execution | None], clock: ManualClock
) -> None:
    await offer(store)
    submitted = await store.execution_submit(new_execution(FFQN, [1, "two", {"3": None}]))
    execution = submitted.execution
    assert submitted.created
    assert execution.status is Status.RUNNING
    assert (execution.lease_owner, execution.lease_epoch) == ("w1", 1)
    assert execution.lease_expires_at == clock.now() + TTL
    assert execution.started_at == execution.created_at == execution.updated_at == clock.now()
    assert execution.history_seq == 2
    # the answer is the stored row, and so is what the worker hears
    assert await store.execution_get(execution.id) == execution
    assert await next_handoff(heard) == execution
    history = await store.history_list(execution.id)
    assert [(e.seq, e.kind) for e in history] == [(1, "pending"), (2, "running")]
    assert history[0].data["params"] == [1, "two", {"3": None}]
    assert history[1].data == {"owner": "w1", "epoch": 1, "attempt": 1,
                               "deployment_id": DEPLOYMENT, "handoff": True}
    # one hand-off per offer: the next submission waits as pending, and the offer is gone
    after = await store.execution_submit(new_execution(FFQN))
    assert after.execution.status is Status.PENDING
    assert await store.offer_withdraw("w1") is False


@POSTGRESQL
async def test_the_handed_lease_is_fenced_as_a_claims(
    store: Store, heard: asyncio.Queue[Execution | None]
) -> None:
    await offer(store)
    execution = (await store.execution_submit(new_execution(FFQN))).execution
    refused = await store.execution_complete_if_owned(Claim(execution.id, "w1", 2), "x")
    assert not refused.applied
    refused = await store.execution_complete_if_owned(Claim(execution.id, "w2", 1), "x")
    assert not refused.applied
    done = await store.execution_complete_if_owned(Claim(execution.id, "w1", 1), "ok")
    assert done.applied and done.execution is not None
    assert done.execution.status is Status.COMPLETED
    kinds = [e.kind for e in await store.history_list(execution.id)]
    assert kinds == ["pending", "running", "late_report", "late_report", "completed"]


def _replace(new: NewExecution, **changes: Any) -> NewExecution:
    return dataclasses.replace(new, **changes)


NOT_TAKEN = {
    "another deployment": lambda clock: new_execution(FFQN, deployment_id="dep-2"),
    "another workflow": lambda clock: new_execution("app.handoff.other"),
    "paused": lambda clock: _replace(new_execution(FFQN), paused=True),
    "due later": lambda clock: new_execution(FFQN, scheduled_at=clock.now() + timedelta(
        seconds=1)),
    "a child": lambda clock: new_execution(FFQN, parent_id=uuid.uuid4()),
    "parameters too large for a notification": lambda clock: new_execution(
        FFQN, ["x" * 4996]),
}


@POSTGRESQL
async def test_the_largest_handed_row_fits_a_notification(
    store: Store, heard: asyncio.Queue[Execution | None], raw: RawSQL
) -> None:
    """A notification carries at most 8000 bytes: a submission is handed off while its
    variable texts (parameters, name, deployment, key, digest) take at most 5000 bytes,
    the longest names and keys in multi-byte characters included."""
    ffqn, deployment, key = "é" * 512, "€" * 128, "€" * 256
    await offer(store, ffqns=(ffqn,), deployment_id=deployment)
    fixed = len(ffqn.encode()) + len(deployment.encode()) + len(key.encode()) + 64
    params = ["x" * (5000 - fixed - 4)]  # ["..."]: 4 bytes of JSON around the text
    new = _replace(new_execution(ffqn, params, deployment_id=deployment, idempotency_key=key),
                   request_digest="d" * 64)
    handed = (await store.execution_submit(new)).execution
    assert handed.status is Status.RUNNING
    assert await next_handoff(heard) == handed
    assert raw.scalar("SELECT octet_length(row_to_json(e)::text) FROM veracity_executions e"
                      " WHERE id = ?", [str(handed.id)]) < 8000
    # a byte more, and it is written pending
    await offer(store, ffqns=(ffqn,), deployment_id=deployment)
    over = _replace(new, id=uuid.uuid4(), idempotency_key="€" * 255 + "\U0001f600")
    assert (await store.execution_submit(over)).execution.status is Status.PENDING


@pytest.mark.parametrize("case", sorted(NOT_TAKEN))
@POSTGRESQL
async def test_an_offer_is_not_taken_by_what_its_worker_would_not_claim_now(
    store: Store, heard: asyncio.Queue[Execution | None], clock: ManualClock, raw: RawSQL,
    case: str
) -> None:
    await offer(store)
    new = NOT_TAKEN[case](clock)
    if new.parent_id is not None:  # a real parent, running
        parent = (await store.execution_submit(new_execution("app.parent"))).execution
        new = _replace(new, parent_id=parent.id)
    submitted = await store.execution_submit(new)
    assert submitted.created
    assert submitted.execution.status is (Status.PAUSED if new.paused else Status.PENDING)
    assert submitted.execution.lease_owner is None
    assert await store.execution_get(new.id) == submitted.execution
    assert raw.scalar("SELECT count(*) FROM veracity_offers") == 1  # still there
    assert await store.offer_withdraw("w1") is True
    assert heard.empty() or all(n is None for n in _drain(heard))


def _drain(queue: asyncio.Queue[Execution | None]) -> list[Execution | None]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


@POSTGRESQL
async def test_an_expired_offer_is_not_taken(
    store: Store, heard: asyncio.Queue[Execution | None], clock: ManualClock
) -> None:
    await offer(store)
    clock.advance(OFFER_FOR)
    submitted = await store.execution_submit(new_execution(FFQN))
    assert submitted.execution.status is Status.PENDING
    # posted again, it is taken
    await offer(store)
    assert (await store.execution_submit(new_execution(FFQN))).execution.status is \
        Status.RUNNING


@POSTGRESQL
async def test_a_submission_whose_key_exists_leaves_the_offer(
    store: Store, heard: asyncio.Queue[Execution | None], raw: RawSQL
) -> None:
    first = await store.execution_submit(new_execution(FFQN, idempotency_key="k1"))
    assert first.execution.status is Status.PENDING
    await offer(store)
    again = await store.execution_submit(new_execution(FFQN, idempotency_key="k1"))
    assert not again.created
    assert again.execution == first.execution
    assert raw.scalar("SELECT count(*) FROM veracity_offers") == 1
    keyed = await store.execution_submit(new_execution(FFQN, idempotency_key="k2"))
    assert keyed.created and keyed.execution.status is Status.RUNNING
    assert (await next_handoff(heard)).idempotency_key == "k2"


@POSTGRESQL
async def test_two_submissions_never_take_one_offer(
    store: Store, heard: asyncio.Queue[Execution | None], open_extra_store: StoreFactory
) -> None:
    others = [await open_extra_store(pool_size=1) for _ in range(8)]
    for _ in range(5):
        await offer(store)
        answers = await asyncio.gather(
            *(s.execution_submit(new_execution(FFQN)) for s in others))
        running = [a.execution for a in answers if a.execution.status is Status.RUNNING]
        assert len(running) == 1, answers
        assert sum(a.execution.status is Status.PENDING for a in answers) == 7
        assert await next_handoff(heard) == running[0]


@POSTGRESQL
async def test_a_batch_takes_no_offer(
    store: Store, heard: asyncio.Queue[Execution | None], raw: RawSQL
) -> None:
    await offer(store)
    answers = await store.execution_submit_many([new_execution(FFQN) for _ in range(3)])
    assert [a.execution.status for a in answers] == [Status.PENDING] * 3
    assert raw.scalar("SELECT count(*) FROM veracity_offers") == 1


@POSTGRESQL
async def test_an_offer_posted_again_replaces_the_workers_last(
    store: Store, heard: asyncio.Queue[Execution | None], raw: RawSQL
) -> None:
    await offer(store, ffqns=("app.handoff.other",))
    await offer(store)
    assert raw.scalar("SELECT count(*) FROM veracity_offers") == 1
    assert (await store.execution_submit(new_execution("app.handoff.other"))).execution \
        .status is Status.PENDING
    assert (await store.execution_submit(new_execution(FFQN))).execution.status is \
        Status.RUNNING


@POSTGRESQL
async def test_offers_long_expired_are_removed_when_one_is_posted(
    store: Store, clock: ManualClock, raw: RawSQL, heard: asyncio.Queue[Execution | None]
) -> None:
    await offer(store, "gone-worker")
    clock.advance(timedelta(minutes=1))
    await offer(store, "w2")
    assert raw.execute("SELECT owner FROM veracity_offers ORDER BY owner") == [
        ("gone-worker",), ("w2",)]  # expired, but not a minute ago yet
    clock.advance(timedelta(seconds=10))
    await offer(store, "w2")
    assert raw.execute("SELECT owner FROM veracity_offers") == [("w2",)]


@POSTGRESQL
async def test_a_worker_stopped_or_gone_has_no_offer(
    store: Store, raw: RawSQL, heard: asyncio.Queue[Execution | None]
) -> None:
    await offer(store)
    await store.worker_stop("w1")
    assert raw.scalar("SELECT count(*) FROM veracity_offers") == 0
    assert (await store.execution_submit(new_execution(FFQN))).execution.status is \
        Status.PENDING


async def test_what_is_leased_to_a_worker(store: Store, clock: ManualClock) -> None:
    """Running executions whose unexpired lease the worker holds (a worker that lost its
    listening connection looks for an unheard hand-off among them), on every backend."""
    subs = [await store.execution_submit(new_execution(FFQN)) for _ in range(4)]
    mine = await store.execution_claim("w1", [FFQN], limit=2, lease_ttl=TTL,
                                       deployment_id=DEPLOYMENT)
    theirs = await store.execution_claim("w2", [FFQN], limit=1, lease_ttl=TTL,
                                         deployment_id=DEPLOYMENT)
    assert len(mine) == 2 and len(theirs) == 1 and len(subs) == 4
    stored = [await store.execution_get(e.id) for e in sorted(mine, key=lambda e: e.id)]
    assert await store.execution_leased_to("w1") == stored
    done = await store.execution_complete_if_owned(
        Claim(mine[0].id, "w1", mine[0].lease_epoch), "ok")
    assert done.applied
    assert [e.id for e in await store.execution_leased_to("w1")] == [mine[1].id]
    clock.advance(TTL)  # expired: no longer held
    assert await store.execution_leased_to("w1") == []
    assert await store.execution_leased_to("nobody") == []


@POSTGRESQL
async def test_an_offer_is_refreshed_while_it_is_there_and_never_made_anew(
    store: Store, heard: asyncio.Queue[Execution | None], clock: ManualClock, raw: RawSQL
) -> None:
    await offer(store)
    clock.advance(timedelta(seconds=1))
    assert await store.offer_refresh("w1", expires_in=OFFER_FOR) is True
    clock.advance(timedelta(seconds=1.5))  # past the first expiry, within the refreshed one
    assert (await store.execution_submit(new_execution(FFQN))).execution.status is \
        Status.RUNNING
    # taken: refreshing says so, and makes no offer in its place
    assert await store.offer_refresh("w1", expires_in=OFFER_FOR) is False
    assert raw.scalar("SELECT count(*) FROM veracity_offers") == 0
    assert (await store.execution_submit(new_execution(FFQN))).execution.status is \
        Status.PENDING
