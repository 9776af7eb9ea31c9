"""The cron service (CronService.run_once) on both backends: slots started once each by
servers ticking side by side, missed slots after a downtime with and without catch-up, new
and changed entries never filling in the past, and what a tick counts and logs.

Time is a :class:`ManualClock` shared by every store of a test: a downtime is the clock
moving on between two ticks, nothing sleeps (except the last test, which runs the loop
for two seconds on the real clock)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.maintenance.conftest import StoreFactory
from veracity.clock import ManualClock
from veracity.core.cron import CATCH_UP_LIMIT, CronEntry, Schedule
from veracity.core.states import Status
from veracity.maintenance.cron import CronMetrics, CronService, CronTick
from veracity.models import Execution, ExecutionFilter
from veracity.store import Store, open_store

FFQN = "test:cron/job.run"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
M = timedelta(minutes=1)


def entry(name: str = "job", schedule: str = "* * * * *", *, timezone: str = "UTC",
          catch_up: bool = False, params: tuple[Any, ...] = ()) -> CronEntry:
    return CronEntry(name, FFQN, Schedule(schedule, timezone), params, catch_up)


class Counted:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = CronMetrics(self.registry)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def service(store: Store, *entries: CronEntry, counted: Counted | None = None) -> CronService:
    return CronService(store, list(entries), deployment_id="d-cron",
                       metrics=counted.metrics if counted else None)


async def executions(store: Store) -> list[Execution]:
    found = await store.execution_list(ExecutionFilter(), limit=1000)
    return sorted(found, key=lambda e: (e.scheduled_at, e.id))


async def slots_of(store: Store) -> list[datetime]:
    return [e.scheduled_at for e in await executions(store)]


async def test_a_slot_starts_an_execution_with_the_slot_in_its_history(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    counted = Counted()
    cron = service(store, entry(params=(1, {"a": "b"})), counted=counted)
    first = await cron.run_once()  # registers: first seen at T0
    assert first.started == [] and first.next_slot == T0 + M
    clock.set(T0 + M + timedelta(milliseconds=250))
    tick = await cron.run_once()
    (started,) = tick.started
    e = await store.execution_get(started.execution.id)
    assert e is not None
    assert (e.status, e.ffqn, e.params, e.deployment_id, e.scheduled_at) == (
        Status.PENDING, FFQN, [1, {"a": "b"}], "d-cron", T0 + M)
    (event,) = await store.history_list(e.id)
    assert event.kind == "pending"
    assert event.data["cron"] == {"name": "job", "slot": (T0 + M).isoformat(),
                                  "slot_local": (T0 + M).isoformat(),
                                  "schedule": "* * * * *", "timezone": "UTC"}
    assert tick.next_slot == T0 + 2 * M
    assert counted.value("veracity_cron_slots_fired_total", entry="job") == 1
    assert counted.value("veracity_cron_ticks_total", outcome="ran") == 2
    assert counted.value("veracity_cron_lateness_seconds_sum") == pytest.approx(0.25)
    record = (await store.cron_records(["job"]))["job"]
    assert (record.last_slot_at, record.last_execution_id) == (T0 + M, e.id)


async def test_ticks_never_start_a_slot_twice(store: Store, clock: ManualClock,
                                              other_store: StoreFactory) -> None:
    """The same moment ticked again (a slow tick and the next), and by other servers."""
    clock.set(T0)
    job = entry(schedule="* * * * * *")
    servers = [service(store, job)] + [service(await other_store(), job) for _ in range(2)]
    for cron in servers:
        await cron.run_once()  # each registers: still first seen at T0
    clock.set(T0 + 3 * S)
    ticks = await asyncio.gather(*(cron.run_once() for cron in servers))
    started = [f.slot_at for t in ticks for f in t.started]
    assert sorted(started) == [T0 + S, T0 + 2 * S, T0 + 3 * S]
    # A server that read the entry before the winner wrote its slots tried them and found
    # them taken; one that read after saw nothing due. Which happens is up to the
    # scheduler (SQLite serialises the ticks), never a slot started twice or half a tick.
    for t in ticks:
        tried = sorted(f.slot_at for f in [*t.started, *t.taken])
        assert tried in ([], [T0 + S, T0 + 2 * S, T0 + 3 * S])
    again = await asyncio.gather(*(cron.run_once() for cron in servers))
    assert all(t.started == [] and t.taken == [] for t in again)
    assert await slots_of(store) == [T0 + S, T0 + 2 * S, T0 + 3 * S]


async def test_a_new_entry_never_fills_in_the_past(store: Store, clock: ManualClock) -> None:
    clock.set(T0 + timedelta(hours=5, seconds=10))
    cron = service(store, entry(schedule="0 * * * *", catch_up=True))
    tick = await cron.run_once()
    assert tick.started == [] and tick.skipped == {}
    assert tick.next_slot == T0 + timedelta(hours=6)
    clock.set(T0 + timedelta(hours=6, seconds=1))
    assert [f.slot_at for f in (await cron.run_once()).started] == [T0 + timedelta(hours=6)]


async def test_a_changed_schedule_is_a_new_entry(store: Store, clock: ManualClock) -> None:
    clock.set(T0)
    await service(store, entry(schedule="0 * * * *", catch_up=True)).run_once()
    # the servers were down for a day, then start with another schedule
    clock.set(T0 + timedelta(days=1, seconds=5))
    changed = service(store, entry(schedule="30 * * * *", catch_up=True))
    tick = await changed.run_once()
    assert tick.started == []  # first seen now: the missed day belongs to the old schedule
    clock.set(T0 + timedelta(days=1, minutes=30, seconds=1))
    assert [f.slot_at for f in (await changed.run_once()).started] == [
        T0 + timedelta(days=1, minutes=30)]


async def test_after_downtime_only_the_latest_missed_slot_fires(
    store: Store, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    clock.set(T0)
    counted = Counted()
    cron = service(store, entry(), counted=counted)
    await cron.run_once()
    clock.set(T0 + M)
    await cron.run_once()  # T0+1m, on time
    # down for an hour: back 40 s after a slot, so no slot is on time
    clock.set(T0 + timedelta(hours=1, seconds=40))
    with caplog.at_level(logging.INFO, logger="veracity.cron"):
        tick = await cron.run_once()
    assert [f.slot_at for f in tick.started] == [T0 + timedelta(hours=1)]
    assert tick.skipped == {"job": 58}  # 00:02 .. 00:59
    assert await slots_of(store) == [T0 + M, T0 + timedelta(hours=1)]
    (late,) = [e for e in await executions(store) if e.scheduled_at != T0 + M]
    (event,) = await store.history_list(late.id)
    assert event.data["cron"]["missed"] is True
    assert counted.value("veracity_cron_slots_skipped_total", entry="job") == 58
    skipped = [r for r in caplog.records if getattr(r, "skipped", None) is not None]
    assert [(r.levelname, r.__dict__["cron"], r.__dict__["skipped"],
             r.__dict__["skipped_more"]) for r in skipped] == [("WARNING", "job", 58, False)]
    fired = [r for r in caplog.records if getattr(r, "execution_id", None)]
    assert [(r.__dict__["domain"], r.__dict__["cron"], r.__dict__["slot"],
             r.__dict__["missed"], r.__dict__["late_seconds"]) for r in fired] == [
        ("cron", "job", (T0 + timedelta(hours=1)).isoformat(), True, 40.0)]
    # nothing more until the next slot; the one after starts normally
    assert (await cron.run_once()).started == []
    clock.set(T0 + timedelta(hours=1, minutes=1))
    assert [f.slot_at for f in (await cron.run_once()).started] == [
        T0 + timedelta(hours=1, minutes=1)]


async def test_a_slot_on_time_after_downtime_skips_the_missed_ones(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    cron = service(store, entry())
    await cron.run_once()
    clock.set(T0 + timedelta(hours=1, seconds=5))
    tick = await cron.run_once()
    assert [f.slot_at for f in tick.started] == [T0 + timedelta(hours=1)]
    assert tick.skipped == {"job": 59}
    (event,) = await store.history_list(tick.started[0].execution.id)
    assert "missed" not in event.data["cron"]  # on time (5 s late)


async def test_with_catch_up_every_missed_slot_fires_in_order(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    cron = service(store, entry(catch_up=True))
    await cron.run_once()
    clock.set(T0 + timedelta(hours=1, seconds=40))
    tick = await cron.run_once()
    expected = [T0 + i * M for i in range(1, 61)]
    assert [f.slot_at for f in tick.started] == expected
    assert tick.skipped == {}
    assert await slots_of(store) == expected
    # created in slot order: the oldest is claimed first
    by_creation = sorted(await executions(store), key=lambda e: e.id)
    assert [e.scheduled_at for e in by_creation] == expected


async def test_catch_up_stops_at_its_limit(store: Store, clock: ManualClock) -> None:
    clock.set(T0)
    cron = service(store, entry(catch_up=True))
    await cron.run_once()
    clock.set(T0 + timedelta(minutes=500, seconds=40))
    tick = await cron.run_once()
    assert [f.slot_at for f in tick.started] == [T0 + i * M for i in range(401, 501)]
    assert len(tick.started) == CATCH_UP_LIMIT and tick.skipped == {"job": 400}


async def test_entries_are_decided_each_on_its_own(store: Store, clock: ManualClock) -> None:
    clock.set(T0)
    cron = service(store, entry("fast", "*/10 * * * * *"), entry("hourly", "0 * * * *"),
                   entry("berlin", "30 2 * * *", timezone="Europe/Berlin", catch_up=True))
    await cron.run_once()
    clock.set(T0 + timedelta(seconds=25))
    tick = await cron.run_once()
    assert [(f.name, f.slot_at) for f in tick.started] == [
        ("fast", T0 + 10 * S), ("fast", T0 + 20 * S)]
    assert tick.next_slot == T0 + 30 * S
    now = T0 + timedelta(days=1, hours=1)  # down a day
    clock.set(now)
    tick = await cron.run_once()
    assert [(f.name, f.slot_at) for f in tick.started] == [
        ("berlin", T0 + timedelta(hours=1, minutes=30)),  # 02:30 CET, caught up
        ("fast", now - 20 * S), ("fast", now - 10 * S), ("fast", now),  # on time
        ("hourly", now)]
    # fast missed more than the count goes: counted up to the limit, and said so
    assert tick.skipped == {"fast": 1000, "hourly": 24} and tick.skipped_more == {"fast"}
    (event,) = await store.history_list(tick.started[0].execution.id)
    assert event.data["cron"]["slot_local"] == "2030-01-01T02:30:00+01:00"


async def test_a_failed_tick_is_counted_and_the_next_one_starts_the_slot(
    store: Store, clock: ManualClock
) -> None:
    clock.set(T0)
    counted = Counted()
    cron = service(store, entry(), counted=counted)
    await cron.run_once()
    clock.set(T0 + M)
    real = store.cron_fire

    async def failing(*_: Any) -> Any:
        raise RuntimeError("database went away")

    store.cron_fire = failing  # type: ignore[method-assign,assignment]
    try:
        with pytest.raises(RuntimeError, match="went away"):
            await cron.run_once()
    finally:
        store.cron_fire = real  # type: ignore[method-assign]
    assert counted.value("veracity_cron_ticks_total", outcome="error") == 1
    assert counted.value("veracity_cron_slots_fired_total", entry="job") == 0
    assert [f.slot_at for f in (await cron.run_once()).started] == [T0 + M]


async def test_the_worker_is_woken_when_slots_start(store: Store, clock: ManualClock) -> None:
    clock.set(T0)
    woken: list[int] = []
    cron = service(store, entry())
    cron.on_started = lambda: woken.append(1)
    await cron.run_once()
    assert woken == []
    clock.set(T0 + M)
    await cron.run_once()
    assert woken == [1]


async def test_no_entries_no_work(store: Store, clock: ManualClock) -> None:
    tick = await service(store).run_once()
    assert tick == CronTick(now=clock.now())


async def test_the_loop_on_the_real_clock_starts_each_second_once(database_url: str,
                                                                   backend: str) -> None:
    """Two services tick side by side on the database's own clock for about two seconds:
    every second between the first slot and the last is started exactly once."""
    stores = [await open_store(database_url, pool_size=2) for _ in range(2)]
    try:
        job = entry(schedule="* * * * * *")
        crons = [service(s, job) for s in stores]
        for cron in crons:
            await cron.register()
        stop = asyncio.Event()
        loops = [asyncio.create_task(cron.run(stop)) for cron in crons]
        await asyncio.sleep(2.5)
        stop.set()
        await asyncio.gather(*loops)
        slots = await slots_of(stores[0])
        assert len(slots) >= 2, slots
        span = int((slots[-1] - slots[0]).total_seconds())
        assert slots == [slots[0] + i * S for i in range(span + 1)], slots
    finally:
        for s in stores:
            await s.close()

