"""Store conformance: what workers and the recovery service need from a store --
batched completions, checkpoints, lease renewal (the heartbeat), lease recovery and the
worker registry. Runs unchanged against every backend."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from tests._helpers import get
from tests.store._support import (
    DB_ERRORS,
    RawSQL,
    StoreFactory,
    assert_history_consistent,
    new_execution,
)
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, Exit, WorkerInfo
from veracity.store import Store, open_store

TTL = timedelta(seconds=30)
FFQN = "app.orders.create"


async def submit_and_claim(store: Store, owner: str = "worker-a", ffqn: str = FFQN) -> Claim:
    new = new_execution(ffqn)
    await store.execution_submit(new)
    claimed = await store.execution_claim(owner, [ffqn], limit=1, lease_ttl=TTL)
    assert [e.id for e in claimed] == [new.id]
    return Claim(new.id, owner, claimed[0].lease_epoch)


async def claim_again(store: Store, owner: str, ffqn: str = FFQN) -> Claim:
    """Claim the one pending execution of ``ffqn`` (released or recovered earlier)."""
    (e,) = await store.execution_claim(owner, [ffqn], limit=1, lease_ttl=TTL)
    return Claim(e.id, owner, e.lease_epoch)


# -- execution_complete_many_if_owned -----------------------------------------------------


async def test_complete_many_applies_owned_and_refuses_the_rest_in_order(
    store: Store, clock: ManualClock
) -> None:
    c1 = await submit_and_claim(store, "w", "app.one")
    c2 = await submit_and_claim(store, "w", "app.two")
    stale = await submit_and_claim(store, "w", "app.three")
    assert (await store.execution_release_if_owned(stale, "again")).applied
    current = await claim_again(store, "w", "app.three")
    assert current.execution_id == stale.execution_id and current.epoch == stale.epoch + 1
    done = await submit_and_claim(store, "w", "app.four")
    assert (await store.execution_complete_if_owned(done, "first")).applied
    theirs = await submit_and_claim(store, "other", "app.five")
    unknown = Claim(uuid.uuid4(), "w", 1)
    at = clock.advance(2)

    results = await store.execution_complete_many_if_owned(
        "w",
        [
            (c1, {"r": 1}),
            (stale, "stale"),
            (c2, None),
            (unknown, "nobody"),
            (done, "second"),
            (Claim(theirs.execution_id, "w", theirs.epoch), "not mine"),
        ],
    )

    assert [r.applied for r in results] == [True, False, True, False, False, False]
    assert results[3].execution is None and results[3].exit is None
    one, two = await get(store, c1.execution_id), await get(store, c2.execution_id)
    assert (one.status, one.result, one.updated_at) == (Status.COMPLETED, {"r": 1}, at)
    assert (two.status, two.result) == (Status.COMPLETED, None)
    # an applied one answers what it wrote, as stored, and not the row; a refused one the
    # current row, as a single completion does
    for r, row in ((results[0], one), (results[2], two)):
        assert r.execution is None and r.reason is None
        assert r.exit == Exit(row.id, row.ffqn, Status.COMPLETED, row.started_at, at)
    for r, claim in ((results[1], stale), (results[4], done), (results[5], theirs)):
        assert r.exit is None
        assert r.execution == await get(store, claim.execution_id)
    assert one.lease_owner is None and one.lease_expires_at is None
    three = await get(store, stale.execution_id)
    assert (three.status, three.lease_epoch) == (Status.RUNNING, current.epoch)
    four = await get(store, done.execution_id)
    assert (four.status, four.result) == (Status.COMPLETED, "first")
    five = await get(store, theirs.execution_id)
    assert (five.status, five.lease_owner) == (Status.RUNNING, "other")

    # the same events as single completions and late reports
    for claim in (c1, c2):
        events = await assert_history_consistent(store, claim.execution_id)
        assert events[-1].kind == "completed"
        assert events[-1].data == {"owner": "w", "epoch": claim.epoch}
    for claim, payload in ((stale, "stale"), (done, "second"), (theirs, "not mine")):
        events = await assert_history_consistent(store, claim.execution_id)
        assert events[-1].kind == "late_report"
        assert events[-1].data["report"] == "complete"
        assert events[-1].data["owner"] == "w"
        assert events[-1].data["payload"] == {"result": payload}
    assert await store.history_list(unknown.execution_id) == []


async def test_complete_many_nothing_to_do(store: Store) -> None:
    assert await store.execution_complete_many_if_owned("w", []) == []


# Values a batch carries inside its one JSON parameter (queries.sql): NUL characters, quotes,
# backslashes, lone surrogates' escapes, non-ASCII, large and exact numbers
AWKWARD: list[object] = [
    "nul\x00inside", {"k\x00": ["\\", '"', "\\u0000", "ü€😀"]}, 2**70, 0.1, -0.0, 1e300,
    [None, True, False, {}, []],
]


async def test_batched_writes_keep_every_value_as_given(store: Store) -> None:
    """Completions, failures and checkpoints written in batches store each value exactly,
    the awkward ones too, and their events say so."""
    claims = [await submit_and_claim(store, "w", f"app.awkward{i}") for i in range(len(AWKWARD))]
    journal = await store.execution_checkpoint_many_if_owned(
        "w", [(c, "step_completed", {"result": v}) for c, v in zip(claims, AWKWARD, strict=True)])
    assert all(r.applied for r in journal)
    done = await store.execution_complete_many_if_owned(
        "w", list(zip(claims[:-1], AWKWARD[:-1], strict=True)))
    assert [r.applied for r in done] == [True] * (len(AWKWARD) - 1)
    error = {"code": "workflow_error", "message": "nul\x00 and \\ \"quoted\""}
    failed = await store.execution_fail_if_owned(claims[-1], error)
    assert failed.applied
    for claim, value in zip(claims[:-1], AWKWARD[:-1], strict=True):
        got = await get(store, claim.execution_id)
        assert got.status is Status.COMPLETED and got.result == value
        assert type(got.result) is type(value)
        history = await store.history_list(claim.execution_id)
        assert history[-2].data == {"result": value}
    got = await get(store, claims[-1].execution_id)
    assert got.status is Status.FAILED and got.error == error


async def test_complete_many_refuses_a_batch_with_another_owners_claim(store: Store) -> None:
    mine = await submit_and_claim(store, "w", "app.one")
    theirs = await submit_and_claim(store, "other", "app.two")
    before = [await get(store, c.execution_id) for c in (mine, theirs)]
    with pytest.raises(ValueError, match="owner"):
        await store.execution_complete_many_if_owned("w", [(mine, 1), (theirs, 2)])
    assert [await get(store, c.execution_id) for c in (mine, theirs)] == before


async def test_complete_many_refuses_expired_leases(store: Store, clock: ManualClock) -> None:
    c = await submit_and_claim(store)
    clock.advance(TTL)
    (r,) = await store.execution_complete_many_if_owned(c.owner, [(c, "late")])
    assert r.applied is False
    assert r.execution is not None and r.execution.status == Status.RUNNING
    events = await assert_history_consistent(store, c.execution_id)
    assert events[-1].kind == "late_report"
    assert "expired" in events[-1].data["reason"]


async def test_complete_many_with_one_execution_twice_applies_it_once(store: Store) -> None:
    """A batch that holds the same lease twice: one completion applies, the other is
    refused and kept -- never two answers of "applied" for one stored result."""
    c = await submit_and_claim(store)
    first, second = await store.execution_complete_many_if_owned(
        c.owner, [(c, "first"), (c, "second")]
    )
    assert [first.applied, second.applied] == [True, False]
    got = await get(store, c.execution_id)
    assert got.result == "first"
    events = await assert_history_consistent(store, c.execution_id)
    assert [e.kind for e in events] == ["pending", "running", "completed", "late_report"]
    assert events[-1].data["payload"] == {"result": "second"}


async def test_complete_many_fails_whole_when_history_insert_fails(
    store: Store, raw: RawSQL
) -> None:
    claims = [await submit_and_claim(store, "w", f"app.n{i}") for i in range(3)]
    before = [await get(store, c.execution_id) for c in claims]
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_complete_many_if_owned("w", [(c, i) for i, c in enumerate(claims)])
    assert [await get(store, c.execution_id) for c in claims] == before
    results = await store.execution_complete_many_if_owned(
        "w", [(c, i) for i, c in enumerate(claims)]
    )
    assert all(r.applied for r in results)
    for c in claims:
        await assert_history_consistent(store, c.execution_id)


# -- execution_checkpoint_if_owned -----------------------------------------------------------


async def test_checkpoint_appends_a_journal_event_and_changes_no_state(
    store: Store, clock: ManualClock
) -> None:
    c = await submit_and_claim(store)
    before = await get(store, c.execution_id)
    steps = []
    for i in range(3):
        at = clock.advance(1)
        data = {"step": f"s{i}", "position": i, "result": [i, {"ü": None}]}
        tr = await store.execution_checkpoint_if_owned(c, "step_completed", data)
        assert tr.applied is True
        steps.append((at, data))
    after = await get(store, c.execution_id)
    assert after.status == Status.RUNNING
    assert (after.lease_owner, after.lease_epoch, after.lease_expires_at) == (
        before.lease_owner,
        before.lease_epoch,
        before.lease_expires_at,
    )
    assert after.history_seq == before.history_seq + 3
    events = await assert_history_consistent(store, c.execution_id)
    journal = events[-3:]
    assert [e.kind for e in journal] == ["step_completed"] * 3
    assert [(e.at, e.data) for e in journal] == steps
    assert [e.seq for e in journal] == [3, 4, 5]
    # the run goes on: completion still applies
    assert (await store.execution_complete_if_owned(c, "done")).applied
    await assert_history_consistent(store, c.execution_id)


async def test_checkpoint_fails_whole_when_history_insert_fails(store: Store, raw: RawSQL) -> None:
    c = await submit_and_claim(store)
    before = await get(store, c.execution_id)
    history = await store.history_list(c.execution_id)
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_checkpoint_if_owned(c, "step_completed", {"step": "a"})
    assert await get(store, c.execution_id) == before
    assert await store.history_list(c.execution_id) == history
    assert (await store.execution_checkpoint_if_owned(c, "step_completed", {"step": "a"})).applied
    await assert_history_consistent(store, c.execution_id)


# -- lease_renew ---------------------------------------------------------------------------


async def test_lease_renew_extends_exactly_the_leases_still_held(
    store: Store, clock: ManualClock
) -> None:
    held = [await submit_and_claim(store, "w", f"app.held{i}") for i in range(3)]
    stale = await submit_and_claim(store, "w", "app.stale")
    assert (await store.execution_release_if_owned(stale, "x")).applied
    reclaimed = await claim_again(store, "w", "app.stale")  # newer epoch now
    finished = await submit_and_claim(store, "w", "app.finished")
    assert (await store.execution_complete_if_owned(finished, 1)).applied
    theirs = await submit_and_claim(store, "other", "app.theirs")
    unknown = Claim(uuid.uuid4(), "w", 1)
    histories = {c.execution_id: await store.history_list(c.execution_id) for c in [*held, stale]}
    before = {c.execution_id: await get(store, c.execution_id) for c in [*held, theirs]}

    at = clock.advance(TTL / 2)
    longer = timedelta(seconds=90)
    # the leases no longer held come before, between and after the held ones: each is
    # passed over, and the rest still renewed
    renewed = await store.lease_renew(
        "w",
        [stale, held[0], finished, held[1], Claim(theirs.execution_id, "w", theirs.epoch),
         held[2], unknown],
        longer,
    )

    assert set(renewed) == set(held)
    for c in held:
        ex = await get(store, c.execution_id)
        assert ex.lease_expires_at == at + longer
        assert ex.status == Status.RUNNING and ex.lease_epoch == c.epoch
        # a renewal is not a state change: nothing is added to history
        assert await store.history_list(c.execution_id) == histories[c.execution_id]
    assert await get(store, theirs.execution_id) == before[theirs.execution_id]
    current = await get(store, reclaimed.execution_id)
    assert current.lease_epoch == reclaimed.epoch
    assert current.lease_expires_at == clock.now() - TTL / 2 + TTL  # untouched

    # the renewed lease outlives its first expiry
    clock.advance(TTL)
    assert (await store.execution_complete_if_owned(held[0], "ok")).applied
    assert not (await store.execution_complete_if_owned(reclaimed, "too late")).applied


async def test_lease_renew_refuses_an_expired_lease(store: Store, clock: ManualClock) -> None:
    c = await submit_and_claim(store)
    clock.advance(TTL)  # exactly at expiry: the lease is gone
    assert await store.lease_renew(c.owner, [c], TTL) == []
    ex = await get(store, c.execution_id)
    assert ex.lease_expires_at == clock.now()


async def test_lease_renew_touches_the_worker_heartbeat(store: Store, clock: ManualClock) -> None:
    await store.worker_register(_worker("w"))
    c = await submit_and_claim(store, "w")
    at = clock.advance(10)
    assert await store.lease_renew("w", [c], TTL) == [c]
    (worker,) = await store.worker_list()
    assert worker.last_heartbeat == at
    at = clock.advance(10)
    assert await store.lease_renew("w", [], TTL) == []  # no leases: still alive
    (worker,) = await store.worker_list()
    assert worker.last_heartbeat == at


# -- execution_recover_expired ---------------------------------------------------------------


async def test_recover_expired_returns_executions_to_pending(
    store: Store, clock: ManualClock
) -> None:
    c = await submit_and_claim(store, "w")
    fresh = await submit_and_claim(store, "w", "app.fresh")
    clock.advance(TTL - timedelta(microseconds=1))
    assert await store.execution_recover_expired(max_attempts=3) == []
    renewed = await store.lease_renew("w", [fresh], TTL)
    assert renewed == [fresh]
    at = clock.advance(timedelta(microseconds=1))  # exactly at c's expiry

    recovered = await store.execution_recover_expired(max_attempts=3)

    assert len(recovered) == 1
    (r,) = recovered
    assert (r.previous_owner, r.previous_epoch) == ("w", c.epoch)
    ex = r.execution
    assert ex.id == c.execution_id
    assert ex.status == Status.PENDING
    assert ex.attempt == 2
    assert ex.lease_owner is None and ex.lease_expires_at is None
    assert ex.lease_epoch == c.epoch
    assert ex.updated_at == at
    assert ex.result is None
    assert await get(store, c.execution_id) == ex
    events = await assert_history_consistent(store, c.execution_id)
    assert events[-1].kind == "pending"
    assert events[-1].data == {
        "reason": "lease expired",
        "owner": "w",
        "epoch": c.epoch,
        "attempt": 1,
        "max_attempts": 3,
    }
    assert (await get(store, fresh.execution_id)).status == Status.RUNNING

    # the old owner's report is refused; a new claim runs attempt 2 with the next epoch
    assert not (await store.execution_complete_if_owned(c, "late")).applied
    claimed = await store.execution_claim("w2", [FFQN], limit=1, lease_ttl=TTL)
    assert [(e.id, e.attempt, e.lease_epoch) for e in claimed] == [(c.execution_id, 2, c.epoch + 1)]
    events = await assert_history_consistent(store, c.execution_id)
    assert events[-1].data["attempt"] == 2


async def test_recover_expired_after_max_attempts_fails_transient(
    store: Store, clock: ManualClock
) -> None:
    c = await submit_and_claim(store, "w")
    for attempt in (1, 2):
        clock.advance(TTL)
        (r,) = await store.execution_recover_expired(max_attempts=3)
        assert (r.execution.status, r.execution.attempt) == (Status.PENDING, attempt + 1)
        c = await claim_again(store, "w")
    clock.advance(TTL)
    (r,) = await store.execution_recover_expired(max_attempts=3)
    ex = r.execution
    assert ex.status == Status.FAILED_TRANSIENT
    assert ex.attempt == 3
    assert ex.result is None
    assert ex.error["code"] == "lease_expired"
    assert "w" in ex.error["message"]
    assert ex.lease_owner is None
    events = await assert_history_consistent(store, c.execution_id)
    assert events[-1].kind == "failed_transient"
    assert events[-1].data["reason"] == "lease expired"
    # terminal is final: nothing recovers or claims it again
    clock.advance(TTL)
    assert await store.execution_recover_expired(max_attempts=3) == []
    assert await store.execution_claim("w", [FFQN], limit=5, lease_ttl=TTL) == []


async def test_recover_expired_with_one_attempt_fails_at_once(
    store: Store, clock: ManualClock
) -> None:
    c = await submit_and_claim(store)
    clock.advance(TTL)
    (r,) = await store.execution_recover_expired(max_attempts=1)
    assert r.execution.status == Status.FAILED_TRANSIENT
    assert r.execution.id == c.execution_id


async def test_recover_expired_leaves_runs_without_a_lease_owner_alone(
    store: Store, raw: RawSQL, clock: ManualClock
) -> None:
    """A run delegated to an external engine holds no lease: recovery never touches it."""
    c = await submit_and_claim(store)
    raw.execute(
        "UPDATE veracity_executions SET lease_owner = NULL WHERE id = ?", [str(c.execution_id)]
    )
    before = await get(store, c.execution_id)
    clock.advance(TTL * 10)
    assert await store.execution_recover_expired(max_attempts=3) == []
    assert await get(store, c.execution_id) == before


async def test_recover_expired_respects_limit_oldest_expiry_first(
    store: Store, clock: ManualClock
) -> None:
    claims = []
    for i in range(4):
        claims.append(await submit_and_claim(store, "w", f"app.n{i}"))
        clock.advance(1)
    clock.advance(TTL)
    first = await store.execution_recover_expired(max_attempts=3, limit=3)
    assert [r.execution.id for r in first] == [c.execution_id for c in claims[:3]]
    second = await store.execution_recover_expired(max_attempts=3, limit=3)
    assert [r.execution.id for r in second] == [claims[3].execution_id]
    assert await store.execution_recover_expired(max_attempts=3, limit=3) == []


async def test_recover_expired_ignores_every_other_state(store: Store, clock: ManualClock) -> None:
    pending = new_execution(FFQN)
    await store.execution_submit(pending)
    done = await submit_and_claim(store, "w", "app.done")
    assert (await store.execution_complete_if_owned(done, 1)).applied
    failed = await submit_and_claim(store, "w", "app.failed")
    assert (await store.execution_fail_if_owned(failed, 1)).applied
    before = [await get(store, i) for i in (pending.id, done.execution_id, failed.execution_id)]
    clock.advance(TTL * 10)
    assert await store.execution_recover_expired(max_attempts=3) == []
    after = [await get(store, i) for i in (pending.id, done.execution_id, failed.execution_id)]
    assert after == before


async def test_recover_expired_fails_whole_when_history_insert_fails(
    store: Store, raw: RawSQL, clock: ManualClock
) -> None:
    claims = [await submit_and_claim(store, "w", f"app.n{i}") for i in range(3)]
    before = [await get(store, c.execution_id) for c in claims]
    clock.advance(TTL)
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_recover_expired(max_attempts=3)
    assert [await get(store, c.execution_id) for c in claims] == before
    assert len(await store.execution_recover_expired(max_attempts=3)) == 3
    for c in claims:
        await assert_history_consistent(store, c.execution_id)


async def test_concurrent_recovery_recovers_each_execution_once(
    store: Store, open_extra_store: StoreFactory, clock: ManualClock
) -> None:
    total = 40
    for i in range(total):
        await store.execution_submit(new_execution(FFQN, [i]))
    claimed = await store.execution_claim("w", [FFQN], limit=total, lease_ttl=TTL)
    assert len(claimed) == total
    clock.advance(TTL)
    recoverers = [await open_extra_store() for _ in range(4)]

    async def drain(s: Store) -> list[uuid.UUID]:
        got: list[uuid.UUID] = []
        while batch := await s.execution_recover_expired(max_attempts=3, limit=5):
            got += [r.execution.id for r in batch]
        return got

    per_instance = await asyncio.gather(*(drain(s) for s in recoverers))
    counts = Counter(i for got in per_instance for i in got)
    assert set(counts) == {e.id for e in claimed}
    assert max(counts.values()) == 1
    for e in claimed[:10]:
        ex = await get(store, e.id)
        assert (ex.status, ex.attempt) == (Status.PENDING, 2)
        events = await assert_history_consistent(store, e.id)
        assert [ev.kind for ev in events] == ["pending", "running", "pending"]


# -- the worker registry ---------------------------------------------------------------------


def _worker(worker_id: str, **kw: object) -> WorkerInfo:
    fields: dict[str, object] = {
        "id": worker_id,
        "host": "host-1",
        "pid": 4242,
        "deployment_id": "dep-1",
        "ffqns": ["app.a", "app.ü"],
        "concurrency": 8,
    }
    fields.update(kw)
    return WorkerInfo(**fields)  # type: ignore[arg-type]


async def test_worker_register_records_the_worker(store: Store, clock: ManualClock) -> None:
    rec = await store.worker_register(_worker("w1"))
    assert (rec.id, rec.host, rec.pid, rec.deployment_id, rec.ffqns, rec.concurrency) == (
        "w1",
        "host-1",
        4242,
        "dep-1",
        ["app.a", "app.ü"],
        8,
    )
    assert rec.started_at == rec.last_heartbeat == clock.now()
    assert rec.stopped_at is None
    assert rec.heartbeat_interval is None  # not given: not recorded
    assert await store.worker_list() == [rec]


async def test_worker_register_records_its_heartbeat_interval(
    store: Store, clock: ManualClock
) -> None:
    rec = await store.worker_register(_worker("w1", heartbeat_interval=0.25))
    assert rec.heartbeat_interval == 0.25
    again = await store.worker_register(_worker("w1", heartbeat_interval=30.0))
    assert again.heartbeat_interval == 30.0
    assert [r.heartbeat_interval for r in await store.worker_list()] == [30.0]


async def test_worker_register_again_updates_and_revives(store: Store, clock: ManualClock) -> None:
    first = await store.worker_register(_worker("w1"))
    clock.advance(5)
    await store.worker_stop("w1")
    at = clock.advance(5)
    again = await store.worker_register(
        _worker("w1", host="host-2", pid=7, ffqns=["app.b"], concurrency=2)
    )
    assert (again.host, again.pid, again.ffqns, again.concurrency) == ("host-2", 7, ["app.b"], 2)
    assert again.started_at == first.started_at
    assert again.last_heartbeat == at
    assert again.stopped_at is None
    assert await store.worker_list() == [again]


async def test_worker_stop_marks_the_worker_stopped(store: Store, clock: ManualClock) -> None:
    await store.worker_register(_worker("w1"))
    at = clock.advance(3)
    await store.worker_stop("w1")
    await store.worker_stop("no-such-worker")  # nothing to stop: no error, nothing made
    (rec,) = await store.worker_list()
    assert rec.id == "w1"
    assert rec.stopped_at == at


async def test_worker_list_newest_first_with_limit(store: Store, clock: ManualClock) -> None:
    for name in ("w1", "w2", "w3"):
        await store.worker_register(_worker(name))
        clock.advance(1)
    assert [w.id for w in await store.worker_list()] == ["w3", "w2", "w1"]
    assert [w.id for w in await store.worker_list(limit=2)] == ["w3", "w2"]


async def test_worker_register_refuses_zero_concurrency(store: Store) -> None:
    with pytest.raises(DB_ERRORS):
        await store.worker_register(_worker("w1", concurrency=0))
    assert await store.worker_list() == []


# -- db_now ------------------------------------------------------------------------------


async def test_db_now_is_the_injected_clock(store: Store, clock: ManualClock) -> None:
    assert await store.db_now() == clock.now()
    clock.advance(timedelta(hours=1, microseconds=7))
    assert await store.db_now() == clock.now()


async def test_db_now_without_an_injected_clock_is_the_databases(database_url: str) -> None:
    s = await open_store(database_url, pool_size=1)
    try:
        now = await s.db_now()
        assert now.utcoffset() == timedelta(0)
        assert abs(now - datetime.now(UTC)) < timedelta(minutes=1)
    finally:
        await s.close()
