"""Store conformance for cron (docs/cron.md), on both backends: entries recorded with the
moment they were first seen, slots started once each by a unique key whoever races for
them, and a slot, its execution and its ``pending`` event written together or not at all."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.store._support import DB_ERRORS, RawSQL, StoreFactory, assert_history_consistent
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import CronDefinition, CronFire, NewExecution
from veracity.store import Store

FFQN = "app:cron/job.run"
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def fire(name: str, slot: datetime, params: list[object] | None = None) -> CronFire:
    return CronFire(name, slot, NewExecution(
        ffqn=FFQN, params=params if params is not None else [name], deployment_id="d-cron",
        id=uuid.uuid4()), {"name": name, "slot": slot.isoformat()})


async def test_register_records_when_an_entry_was_first_seen(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    records = await store.cron_register([CronDefinition("a", "* * * * *", "UTC"),
                                         CronDefinition("b", "0 3 * * *", "Europe/Berlin")])
    assert sorted(records) == ["a", "b"]
    assert records["b"].first_seen_at == T0
    assert (records["b"].schedule, records["b"].timezone) == ("0 3 * * *", "Europe/Berlin")
    assert records["a"].last_slot_at is None and records["a"].last_execution_id is None
    # the same definition again (another server, a restart): still first seen at T0
    clock.set(T0 + timedelta(hours=1))
    again = await store.cron_register([CronDefinition("a", "* * * * *", "UTC")])
    assert again["a"].first_seen_at == T0
    # a changed schedule, or time zone, is a new entry: first seen now
    changed = await store.cron_register([CronDefinition("a", "*/5 * * * *", "UTC"),
                                         CronDefinition("b", "0 3 * * *", "UTC")])
    assert changed["a"].first_seen_at == changed["b"].first_seen_at == T0 + timedelta(hours=1)
    assert changed["a"].schedule == "*/5 * * * *" and changed["b"].timezone == "UTC"
    assert await store.cron_records(["a", "nope"]) == {"a": changed["a"]}
    assert await store.cron_records([]) == {}
    with pytest.raises(ValueError, match="once each"):
        await store.cron_register([CronDefinition("a", "* * * * *", "UTC")] * 2)


async def test_fire_starts_each_slot_once_with_its_execution_and_event(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    await store.cron_register([CronDefinition("job", "* * * * *", "UTC")])
    clock.set(T0 + timedelta(minutes=2, seconds=3))
    first, second = fire("job", T0 + timedelta(minutes=1)), fire("job", T0 + timedelta(minutes=2))
    started = await store.cron_fire([second, first])
    assert started == [first, second]  # in key order
    for f in started:
        e = await store.execution_get(f.execution.id)
        assert e is not None
        assert (e.status, e.ffqn, e.params, e.deployment_id) == (
            Status.PENDING, FFQN, ["job"], "d-cron")
        assert e.scheduled_at == f.slot_at and e.created_at == clock.now()
        (event,) = await assert_history_consistent(store, e.id)
        assert event.kind == "pending" and event.at == clock.now()
        assert event.data["cron"] == {"name": "job", "slot": f.slot_at.isoformat()}
        assert event.data["scheduled_at"] == f.slot_at.isoformat()
        assert event.data["params"] == ["job"] and event.data["ffqn"] == FFQN
    record = (await store.cron_records(["job"]))["job"]
    assert record.last_slot_at == second.slot_at
    assert (record.last_execution_id, record.last_status) == (second.execution.id,
                                                              Status.PENDING)
    # the same slots again, with other execution ids: nothing is started or written
    again = [fire("job", first.slot_at), fire("job", second.slot_at)]
    assert await store.cron_fire(again) == []
    for f in again:
        assert await store.execution_get(f.execution.id) is None
    # a mix: only the free key
    third = fire("job", T0 + timedelta(minutes=3))
    assert await store.cron_fire([fire("job", second.slot_at), third]) == [third]
    # an older slot that was never started may still start; the newest stays the last
    older = fire("job", T0 + timedelta(seconds=30))
    assert await store.cron_fire([older]) == [older]
    assert (await store.cron_records(["job"]))["job"].last_slot_at == third.slot_at


async def test_the_last_slot_shows_its_execution_status(store: Store, clock: ManualClock
                                                        ) -> None:
    clock.set(T0)
    await store.cron_register([CronDefinition("job", "* * * * *", "UTC")])
    f = fire("job", T0 + timedelta(minutes=1))
    await store.cron_fire([f])
    await store.execution_pause(f.execution.id, actor="test")
    assert (await store.cron_records(["job"]))["job"].last_status == Status.PAUSED


async def test_racing_stores_start_every_slot_exactly_once(
    store: Store, open_extra_store: StoreFactory, clock: ManualClock, raw: RawSQL
) -> None:
    """Two stores (two servers) fire the same slots at once, in different orders and
    batches: each slot starts once, and neither fails (no deadlock surfaces)."""
    clock.set(T0)
    names = [f"e{i:02d}" for i in range(20)]
    await store.cron_register([CronDefinition(n, "* * * * * *", "UTC") for n in names])
    others = [await open_extra_store() for _ in range(2)]
    slots = [(n, T0 + timedelta(seconds=s)) for n in names for s in range(1, 11)]

    async def server(s: Store, seed: int) -> list[CronFire]:
        rng = random.Random(seed)
        mine = list(slots)
        rng.shuffle(mine)
        started: list[CronFire] = []
        for i in range(0, len(mine), 37):
            started += await s.cron_fire([fire(n, at) for n, at in mine[i:i + 37]])
        return started

    results = await asyncio.gather(server(store, 1), server(others[0], 2),
                                    server(others[1], 3))
    keys = [(f.name, f.slot_at) for r in results for f in r]
    assert sorted(keys) == sorted(slots)  # every slot once, none twice
    assert raw.scalar("SELECT count(*) FROM veracity_executions") == len(slots)
    assert raw.scalar("SELECT count(*) FROM veracity_cron_slots") == len(slots)
    assert raw.scalar("SELECT count(*) FROM veracity_history") == len(slots)


async def test_a_failed_write_leaves_the_slot_free(
    store: Store, clock: ManualClock, raw: RawSQL
) -> None:
    clock.set(T0)
    await store.cron_register([CronDefinition("job", "* * * * *", "UTC")])
    f = fire("job", T0 + timedelta(minutes=1))
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.cron_fire([f])
    assert raw.scalar("SELECT count(*) FROM veracity_cron_slots") == 0
    assert await store.execution_get(f.execution.id) is None
    # the slot is still free: a later tick starts it
    assert await store.cron_fire([f]) == [f]


async def test_an_entry_never_registered_cannot_fire(store: Store, raw: RawSQL) -> None:
    with pytest.raises(DB_ERRORS):
        await store.cron_fire([fire("ghost", T0)])
    assert raw.scalar("SELECT count(*) FROM veracity_executions") == 0


async def test_bad_calls_are_refused_before_writing(store: Store, raw: RawSQL) -> None:
    await store.cron_register([CronDefinition("job", "* * * * *", "UTC")])
    f = fire("job", T0)
    with pytest.raises(ValueError, match="once per call"):
        await store.cron_fire([f, fire("job", T0)])
    with pytest.raises(ValueError, match="naive"):
        await store.cron_fire([fire("job", datetime(2030, 1, 1))])
    child = CronFire("job", T0, NewExecution(FFQN, [], "d", uuid.uuid4(),
                                             parent_id=uuid.uuid4()))
    with pytest.raises(ValueError, match="top-level"):
        await store.cron_fire([child])
    assert await store.cron_fire([]) == []
    assert raw.scalar("SELECT count(*) FROM veracity_cron_slots") == 0


async def test_the_schema_keeps_one_row_per_slot(store: Store, raw: RawSQL) -> None:
    await store.cron_register([CronDefinition("job", "* * * * *", "UTC")])
    f = fire("job", T0)
    await store.cron_fire([f])
    at = raw.scalar("SELECT slot_at FROM veracity_cron_slots")
    with pytest.raises(DB_ERRORS):
        raw.execute("INSERT INTO veracity_cron_slots (name, slot_at, execution_id, fired_at) "
                    "SELECT name, slot_at, execution_id, fired_at FROM veracity_cron_slots")
    assert raw.scalar("SELECT count(*) FROM veracity_cron_slots") == 1
    assert raw.scalar("SELECT slot_at FROM veracity_cron_slots") == at
