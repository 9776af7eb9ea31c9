"""Store conformance: retention (``execution_prune``, docs/operations.md, Retention): what
is deleted, with its history, messages and cron slots, and what never is. Runs unchanged
against every backend."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.store._support import (
    RawSQL,
    StoreFactory,
    claim_exactly,
    get,
    new_child,
    submit_unique,
)
from tests.store.test_engine_ops import finish, running
from tests.store.test_external import attached, operator_ends
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, CronDefinition, CronFire, Execution, NewExecution, PruneBatch
from veracity.store import Store

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)


async def ended(store: Store, how: str = "completed") -> Execution:
    e = await submit_unique(store)
    await finish(store, e.id, how)
    return await get(store, e.id)


async def prune_all(store: Store, cutoff: datetime, *, limit: int = 500,
                    dry_run: bool = False) -> list[PruneBatch]:
    """Every batch of one pass, as the retention service drives them."""
    batches: list[PruneBatch] = []
    after = None
    while True:
        b = await store.execution_prune(cutoff=cutoff, limit=limit, after=after,
                                        dry_run=dry_run)
        if b.cursor is None and not b.partial:  # no root read
            return batches
        batches.append(b)
        after = b.cursor if b.cursor is not None else after
        if not b.more:
            return batches


async def gone(store: Store, *ids: uuid.UUID) -> bool:
    for i in ids:
        if await store.execution_get(i) is not None or await store.history_list(i):
            return False
    return True


async def present(store: Store, *ids: uuid.UUID) -> bool:
    return all([await store.execution_get(i) is not None for i in ids])


async def test_ended_executions_go_with_their_history_and_messages_the_rest_stays(
    store: Store, clock: ManualClock, raw: RawSQL
) -> None:
    clock.set(T0)
    done = await ended(store)
    failed = await ended(store, "failed")
    # a message sent while it ran, consumed or not, goes with it
    claim = await running(store)
    assert (await store.message_send(claim.execution_id, "t", {"m": 1})).changed
    assert (await store.execution_complete_if_owned(claim, 1)).applied
    to_cancel = await submit_unique(store, cancellable=True)
    await store.execution_cancel(to_cancel.id)
    cancelled = await get(store, to_cancel.id)
    assert cancelled.status == Status.CANCELLED
    # unfinished ones, however old: never
    pending = await submit_unique(store)
    paused = await submit_unique(store, paused=True)
    run = await running(store)
    waiting = await running(store)  # blocked on a message, with no timeout
    assert (await store.execution_block_if_owned(
        waiting, wake_at=None, seen_signal=0, events=[], reason="wait")).applied
    clock.set(T0 + 10 * DAY)
    recent = await ended(store)

    olds = [done.id, failed.id, claim.execution_id, cancelled.id]
    events = sum([len(await store.history_list(i)) for i in olds])
    assert events >= 3 + 3 + 3 + 2  # pending, running, end; pending, cancelled
    cutoff = T0 + 5 * DAY
    zero = {"executions": 0, "history": 0, "messages": 0}
    assert await store.retention_totals() == zero
    batches = await prune_all(store, cutoff)

    assert sum(b.executions for b in batches) == 4
    assert sum(b.messages for b in batches) == 1
    assert sum(b.history for b in batches) == events
    # counted in the database, in each batch's transaction (veracity_pruned_total)
    assert await store.retention_totals() == {"executions": 4, "history": events,
                                              "messages": 1}
    assert await gone(store, *olds)
    assert raw.scalar("SELECT count(*) FROM veracity_messages") == 0
    assert await present(store, pending.id, paused.id, run.execution_id,
                         waiting.execution_id, recent.id)
    assert (await get(store, waiting.execution_id)).status == Status.BLOCKED
    # unfinished rows are not even read: only ended top-level ones are candidates
    assert sum(b.roots for b in batches) == 4
    assert (await get(store, run.execution_id)).status == Status.RUNNING
    # a second pass finds nothing more
    assert await prune_all(store, cutoff) == []


async def test_a_dry_run_counts_and_deletes_nothing(store: Store, clock: ManualClock) -> None:
    clock.set(T0)
    olds = [await ended(store) for _ in range(3)]
    claim = await running(store)  # and one with a message
    assert (await store.message_send(claim.execution_id, "t", {"m": 1})).changed
    assert (await store.execution_complete_if_owned(claim, 1)).applied
    olds.append(await get(store, claim.execution_id))
    events = [len(await store.history_list(e.id)) for e in olds]
    clock.set(T0 + 10 * DAY)
    batches = await prune_all(store, T0 + DAY, limit=2, dry_run=True)
    # what deleting them would delete: the executions, their events and messages
    assert [b.executions for b in batches] == [2, 2]
    assert sum(b.history for b in batches) == sum(events)
    assert sum(b.messages for b in batches) == 1
    assert await present(store, *(e.id for e in olds))
    assert [len(await store.history_list(e.id)) for e in olds] == events
    assert await store.retention_totals() == {"executions": 0, "history": 0, "messages": 0}


async def test_batches_are_read_oldest_end_first_after_the_cursor(
    store: Store, clock: ManualClock
) -> None:
    ids = []
    for n in range(5):
        clock.set(T0 + n * timedelta(hours=1))
        ids.append((await ended(store)).id)
    clock.set(T0 + 10 * DAY)
    batches = await prune_all(store, T0 + timedelta(hours=3), limit=2)
    # ended at 0h, 1h, 2h go (before the cutoff at 3h); 3h and 4h stay
    assert [b.executions for b in batches] == [2, 1]
    assert await gone(store, *ids[:3])
    assert await present(store, *ids[3:])


async def test_children_go_with_their_parent_never_before_it(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    parent = await running(store)
    kids = [new_child(parent.execution_id), new_child(parent.execution_id)]
    grandchild_parent = kids[0]
    assert (await store.execution_spawn_if_owned(parent, kids, [])).applied
    gp = await claim_exactly(store, grandchild_parent.id, owner="worker-k")
    grand = new_child(grandchild_parent.id)
    assert (await store.execution_spawn_if_owned(gp, [grand], [])).applied
    await finish(store, grand.id)
    assert (await store.execution_complete_if_owned(gp, "k")).applied
    await finish(store, kids[1].id)
    sec = timedelta(seconds=1)
    clock.set(T0 + 10 * sec)  # within the parent's lease
    # every child ended before the cutoff, the parent still runs: none goes
    assert sum(b.executions for b in await prune_all(store, T0 + 5 * sec)) == 0
    family = [parent.execution_id, kids[0].id, kids[1].id, grand.id]
    assert await present(store, *family)
    # the parent ends after the cutoff: still none
    assert (await store.execution_complete_if_owned(parent, "p")).applied
    clock.set(T0 + 20 * sec)
    assert sum(b.executions for b in await prune_all(store, T0 + 5 * sec)) == 0
    assert await present(store, *family)
    # every member ended before the cutoff: the whole family goes at once
    batches = await prune_all(store, T0 + 15 * sec)
    assert sum(b.executions for b in batches) == 4
    assert sum(b.roots for b in batches) == 1
    assert await gone(store, *family)


async def test_an_ended_parent_with_an_unfinished_child_stays(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    parent = await running(store)
    kid = new_child(parent.execution_id)
    assert (await store.execution_spawn_if_owned(parent, [kid], [])).applied
    assert (await store.execution_complete_if_owned(parent, "p")).applied
    assert (await get(store, kid.id)).status == Status.PENDING
    clock.set(T0 + 10 * DAY)
    batches = await prune_all(store, T0 + 5 * DAY)
    assert sum(b.executions for b in batches) == 0
    assert [b.kept for b in batches] == [{"unfinished": 1}]
    assert await present(store, parent.execution_id, kid.id)


async def test_a_flagged_execution_stays_until_its_flag_is_cleared(
    store: Store, clock: ManualClock
) -> None:
    """Ended by an operator without the engine's confirmation (``forced``): it stays on
    the flagged list, terminal, so that the run is checked in the engine
    (docs/external.md); retention never deletes it."""
    clock.set(T0)
    forced = await attached(store, "run-f")
    assert (await operator_ends(store, forced)).changed
    assert (await get(store, forced)).status.is_terminal
    plain = await ended(store)
    clock.set(T0 + 10 * DAY)
    batches = await prune_all(store, T0 + 5 * DAY)
    assert sum(b.executions for b in batches) == 1
    assert [b.kept for b in batches] == [{"flagged": 1}]
    assert await gone(store, plain.id) and await present(store, forced)
    assert await store.execution_flag_counts() == {"forced": 1}


async def family_of(store: Store, kids: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """An ended top-level execution with ``kids`` ended children."""
    parent = await running(store)
    children = [new_child(parent.execution_id) for _ in range(kids)]
    assert (await store.execution_spawn_if_owned(parent, children, [])).applied
    for kid in children:
        await finish(store, kid.id)
    assert (await store.execution_complete_if_owned(parent, "p")).applied
    return parent.execution_id, [k.id for k in children]


async def test_a_batch_deletes_at_most_its_limit_a_large_family_in_parts_root_last(
    store: Store, clock: ManualClock
) -> None:
    """A batch holds at most ``limit`` executions, whole families as long as they fit; a
    family larger than that goes a part at a time, its children first, its root with its
    last part (the cursor stays on it meanwhile)."""
    clock.set(T0)
    root, kids = await family_of(store, 7)  # 8 executions
    clock.set(T0 + timedelta(hours=1))
    others = [(await ended(store)).id for _ in range(2)]
    clock.set(T0 + 10 * DAY)
    # counted whole in a dry run, which holds nothing
    dry = await prune_all(store, T0 + 5 * DAY, limit=3, dry_run=True)
    assert [b.executions for b in dry] == [8, 2] and [b.partial for b in dry] == [False] * 2
    seen = [(b.executions, b.partial, len(b.rest), root_there)
            async for b, root_there in passing(store, T0 + 5 * DAY, 3, root)]
    # 3 children (4 left, their order given back), 3 more, the last one (the family not
    # read again meanwhile), then the root read again with the two other roots
    assert seen == [(3, True, 4, True), (3, True, 1, True), (1, True, 0, True),
                    (3, False, 0, False)]
    assert await gone(store, root, *kids, *others)


async def passing(store: Store, cutoff: datetime, limit: int, root: uuid.UUID
                  ) -> AsyncIterator[tuple[PruneBatch, bool]]:
    """A pass's batches as the retention service drives them (``rest`` given back), each
    with whether ``root`` is still there after it."""
    after: tuple[datetime, uuid.UUID] | None = None
    rest: tuple[uuid.UUID, ...] = ()
    while True:
        b = await store.execution_prune(cutoff=cutoff, limit=limit, after=after, rest=rest)
        if b.cursor is None and not b.partial:
            return
        yield b, await present(store, root)
        after, rest = b.cursor if b.cursor is not None else after, b.rest
        if not b.more:
            return


async def test_a_part_that_changed_since_its_family_was_read_goes_not_and_is_read_again(
    store: Store, clock: ManualClock, raw: RawSQL
) -> None:
    """The later parts of a large family are checked under their lock: a member flagged
    since the family was read stops them; the family is read again, and kept."""
    clock.set(T0)
    root, _ = await family_of(store, 7)
    clock.set(T0 + 10 * DAY)
    first = await store.execution_prune(cutoff=T0 + 5 * DAY, limit=3)
    assert (first.executions, first.partial, len(first.rest)) == (3, True, 4)
    raw.execute("UPDATE veracity_executions SET flagged_at = updated_at, "
                "flag_kind = 'forced', flag_reason = 'r' WHERE id = ?",
                (str(first.rest[0]),))  # one of the next part
    stopped = await store.execution_prune(cutoff=T0 + 5 * DAY, limit=3, rest=first.rest)
    assert (stopped.executions, stopped.rest, stopped.kept) == (0, (), {"changed": 1})
    again = await store.execution_prune(cutoff=T0 + 5 * DAY, limit=3)
    assert (again.executions, again.kept, again.more) == (0, {"flagged": 1}, False)
    assert await present(store, root, *first.rest)


def retry_new(old: Execution) -> NewExecution:
    return NewExecution(ffqn=old.ffqn, params=old.params, deployment_id="dep-1",
                        id=uuid.uuid4(), retry_of=old.id)


async def test_a_retried_execution_goes_with_or_after_its_retry(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    old = await ended(store, "failed")
    retry = retry_new(old)
    assert (await store.execution_retry(old.id, retry, [])).changed
    clock.set(T0 + 10 * DAY)
    # the retry has not ended: the original stays, as the retry replays its calls
    batches = await prune_all(store, T0 + 5 * DAY)
    assert sum(b.executions for b in batches) == 0
    assert [b.kept for b in batches] == [{"retried": 1}]
    # the retry ends long ago too: both go, in the same batch
    await finish(store, retry.id)
    clock.set(T0 + 20 * DAY)
    batches = await prune_all(store, T0 + 15 * DAY)
    assert [b.executions for b in batches] == [2]
    assert await gone(store, old.id, retry.id)


async def test_a_retry_in_a_later_batch_lets_its_original_go_at_the_next_pass(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    old = await ended(store, "failed")
    retry = retry_new(old)
    assert (await store.execution_retry(old.id, retry, [])).changed
    clock.set(T0 + DAY)
    await finish(store, retry.id)
    clock.set(T0 + 10 * DAY)
    # one root a batch: the original is read first, while its retry stays; then the retry
    batches = await prune_all(store, T0 + 5 * DAY, limit=1)
    assert [b.executions for b in batches] == [0, 1]
    assert await present(store, old.id)
    assert await gone(store, retry.id)
    assert [b.executions for b in await prune_all(store, T0 + 5 * DAY, limit=1)] == [1]
    assert await gone(store, old.id)


async def test_the_latest_slot_of_a_cron_entry_stays(
    store: Store, clock: ManualClock, raw: RawSQL
) -> None:
    clock.set(T0)
    await store.cron_register([CronDefinition("job", "* * * * *", "UTC")])
    fires = [CronFire("job", T0 + timedelta(minutes=m), NewExecution(
        ffqn="app:cron/job.run", params=[], deployment_id="dep-1", id=uuid.uuid4()))
        for m in (1, 2)]
    clock.set(T0 + timedelta(minutes=3))
    assert len(await store.cron_fire(fires)) == 2
    for f in fires:
        await complete_cron(store, f.execution.id)
    clock.set(T0 + 10 * DAY)
    batches = await prune_all(store, T0 + 5 * DAY)
    assert sum(b.executions for b in batches) == 1
    assert await gone(store, fires[0].execution.id)
    assert await present(store, fires[1].execution.id)
    assert raw.scalar("SELECT count(*) FROM veracity_cron_slots") == 1
    record = (await store.cron_records(["job"]))["job"]
    assert record.last_execution_id == fires[1].execution.id


async def complete_cron(store: Store, execution_id: uuid.UUID) -> None:
    """Complete a cron execution (its name is shared, so claim it by deployment)."""
    claimed = await store.execution_claim("worker-c", ["app:cron/job.run"], limit=1,
                                          lease_ttl=timedelta(seconds=30))
    assert [c.id for c in claimed] == [execution_id]
    claim = Claim(claimed[0].id, "worker-c", claimed[0].lease_epoch)
    assert (await store.execution_complete_if_owned(claim, 1)).applied


@pytest.mark.parametrize("bad", [
    {"cutoff": datetime(2030, 1, 1)},  # naive: which zone?
    {"cutoff": T0, "limit": 0},
    {"cutoff": T0, "after": (datetime(2030, 1, 1), uuid.uuid4())},
    {"cutoff": T0, "dry_run": True, "rest": (uuid.uuid4(),)},  # a dry run deletes no part
])
async def test_bad_calls_are_refused_before_reading(store: Store, bad: dict[str, object]
                                                     ) -> None:
    with pytest.raises(ValueError):
        await store.execution_prune(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["postgresql"])  # SQLite: one write lock for every write
async def test_a_batch_holds_no_lock_that_a_worker_waits_on(
    store: Store, clock: ManualClock, raw: RawSQL, open_extra_store: StoreFactory
) -> None:
    """docs/operations.md, Retention: a batch locks only the ended rows it deletes, so a
    worker never waits on it. The batch is held inside its transaction, its locks taken
    (a trigger sleeps before it deletes the executions), while a worker of another store
    submits, claims, heartbeats, blocks, is sent a message, completes, fails, is
    cancelled and has an expired lease recovered: each is done before the batch ends."""
    clock.set(T0)
    olds = [(await ended(store)).id, (await ended(store, "failed")).id]
    clock.set(T0 + 10 * DAY)
    to_complete, to_fail, to_block = [await running(store) for _ in range(3)]
    expiring = await claim_exactly(store, (await submit_unique(store)).id,
                                   owner="worker-gone", ttl=timedelta(seconds=1))
    to_cancel = await submit_unique(store, cancellable=True)
    raw.execute("CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$")
    raw.execute("CREATE TRIGGER test_hold BEFORE DELETE ON veracity_executions "
                "FOR EACH STATEMENT EXECUTE FUNCTION test_hold()")
    worker = await open_extra_store()
    batch = asyncio.create_task(store.execution_prune(cutoff=T0 + 5 * DAY))
    for _ in range(500):  # until the batch sleeps, its rows locked
        if raw.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                      "AND datname = current_database()"):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the batch never reached its delete")
    assert not batch.done()

    submitted = await submit_unique(worker)
    claim = await claim_exactly(worker, submitted.id)
    assert await worker.lease_renew(claim.owner, [claim], timedelta(seconds=30)) == [claim]
    assert (await worker.execution_block_if_owned(
        to_block, wake_at=None, seen_signal=0, events=[], reason="wait")).applied
    assert (await worker.message_send(to_block.execution_id, "t", 1)).changed
    assert (await worker.execution_complete_if_owned(to_complete, 1)).applied
    assert (await worker.execution_fail_if_owned(to_fail, {"code": "x"})).applied
    assert (await worker.execution_cancel(to_cancel.id)).changed
    clock.advance(2)
    (recovered,) = await worker.execution_recover_expired(max_attempts=3)
    assert recovered.execution.id == expiring.execution_id
    assert not batch.done()  # all of it while the batch held its locks

    done = await batch
    assert done.executions == 2 and await gone(store, *olds)
