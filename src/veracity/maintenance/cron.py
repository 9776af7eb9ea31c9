"""Cron (docs/cron.md): every ``veracity server`` runs this service for the ``[[cron]]``
entries of its configuration, and each slot of an entry starts one execution however
many servers run it.

No lock decides who fires: each tick reads the database's clock and every entry's record
(when it was first seen, its newest slot), decides which slots are due
(:func:`veracity.core.cron.decide`) and starts them all with one
:meth:`~veracity.store.protocol.MaintenanceStore.cron_fire`: one transaction that claims
each slot's unique key (name, slot time) and inserts the execution of every key it got,
with its ``pending`` event. A key another server holds is waited for, then left alone. So
two servers, or a slow tick and the next one, never start a slot twice: the key is
already there.

Between ticks it sleeps until the next slot of any entry (at most :data:`MAX_SLEEP`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram

from veracity._ids import new_execution_id
from veracity.core.cron import MISSED_COUNT_LIMIT, CronEntry, Due, decide
from veracity.models import JSON, CronDefinition, CronFire, CronRecord, NewExecution
from veracity.store.protocol import MaintenanceStore

log = logging.getLogger("veracity.cron")
DOMAIN = {"domain": "cron"}
MAX_SLEEP = 60.0
"""Seconds a server sleeps at most between ticks when no slot is due sooner."""
ERROR_SLEEP = 1.0
"""Seconds before the tick after a failed one."""
BATCH = 1000
"""Slots started per transaction."""


class CronMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.ticks = Counter("veracity_cron_ticks", "Cron ticks by outcome", ["outcome"],
                             registry=registry)
        self.fired = Counter("veracity_cron_slots_fired",
                             "Slots this server started an execution for, by entry",
                             ["entry"], registry=registry)
        self.taken = Counter("veracity_cron_slots_taken",
                             "Due slots another server had started first, by entry",
                             ["entry"], registry=registry)
        self.skipped = Counter(
            "veracity_cron_slots_skipped",
            f"Missed slots passed over, by entry (counted up to {MISSED_COUNT_LIMIT:,} per "
            "entry and decision; the log line says when there were more)",
            ["entry"], registry=registry)
        self.lateness = Histogram(
            "veracity_cron_lateness_seconds",
            "How long after its slot time this server started a slot (database clock)",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))
        self.duration = Histogram("veracity_cron_tick_duration_seconds",
                                  "Duration of cron ticks", registry=registry,
                                  buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10))
        for outcome in ("ran", "error"):
            self.ticks.labels(outcome)


@dataclass
class CronTick:
    """What one tick did."""

    now: datetime
    started: list[CronFire] = field(default_factory=list)
    taken: list[CronFire] = field(default_factory=list)
    """Due slots another server had started first."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Missed slots passed over, by entry (a lower bound for the entries in
    ``skipped_more``)."""
    skipped_more: set[str] = field(default_factory=set)
    next_slot: datetime | None = None
    """The earliest slot after ``now`` of any entry."""


class CronService:
    name = "cron"

    def __init__(
        self,
        store: MaintenanceStore,
        entries: Sequence[CronEntry],
        *,
        deployment_id: str,
        metrics: CronMetrics | None = None,
        on_started: Callable[[], None] | None = None,
        max_sleep: float = MAX_SLEEP,
    ) -> None:
        if len({e.name for e in entries}) != len(entries):
            raise ValueError("cron entries need names of their own")
        self.store = store
        self.entries = list(entries)
        self.deployment_id = deployment_id
        self.metrics = metrics or CronMetrics(CollectorRegistry())
        self.on_started = on_started
        """Called after a tick started executions (wakes an in-process worker)."""
        self.max_sleep = max_sleep
        self._registered = False
        # per entry: (after, the first slot after it), so that an entry with nothing due
        # costs a comparison, and one due costs one step of its schedule
        self._next: dict[str, tuple[datetime, datetime | None]] = {}

    async def register(self) -> dict[str, CronRecord]:
        """Record the entries (a server does this at start): an entry new to the database,
        or whose schedule or time zone changed, is first seen now."""
        records = await self.store.cron_register([
            CronDefinition(e.name, e.expression, e.timezone) for e in self.entries])
        self._registered = True
        return records

    async def run_once(self) -> CronTick:
        """One tick. A tick that fails (the database raises) counts ``outcome="error"``
        and raises; what it did not commit is decided again by the next tick."""
        started = time.monotonic()
        try:
            tick = await self._tick()
        except Exception:
            self.metrics.ticks.labels("error").inc()
            raise
        finally:
            self.metrics.duration.observe(time.monotonic() - started)
        self.metrics.ticks.labels("ran").inc()
        return tick

    async def _tick(self) -> CronTick:
        if not self.entries:
            return CronTick(now=await self.store.db_now())
        if not self._registered:
            await self.register()
        now = await self.store.db_now()
        records = await self.store.cron_records([e.name for e in self.entries])
        if len(records) < len(self.entries):  # the database lost them (restored, reset)
            records = await self.register()
        tick = CronTick(now=now)
        fires: list[CronFire] = []
        decisions: dict[str, Due] = {}
        upcoming: list[datetime] = []
        for entry in self.entries:
            record = records[entry.name]
            after = max(record.first_seen_at, record.last_slot_at or record.first_seen_at)
            cached = self._next.get(entry.name)
            due = decide(entry.schedule, after=after, now=now, catch_up=entry.catch_up,
                         first=cached[1] if cached and cached[0] == after else
                         entry.schedule.next_after(after))
            # the next tick's after, if these slots are recorded (by us or another server)
            self._next[entry.name] = (due.fire[-1], due.next) if due.fire else (after,
                                                                                  due.next)
            if due.next is not None:
                upcoming.append(due.next)
            if due.fire:
                decisions[entry.name] = due
                fires.extend(self._fire(entry, slot, slot in due.missed) for slot in due.fire)
        for i in range(0, len(fires), BATCH):
            batch = fires[i:i + BATCH]
            mine = await self.store.cron_fire(batch)
            ids = {f.execution.id for f in mine}
            tick.started.extend(mine)
            tick.taken.extend(f for f in batch if f.execution.id not in ids)
        self._account(tick, decisions)
        tick.next_slot = min(upcoming, default=None)
        if tick.started and self.on_started is not None:
            self.on_started()
        return tick

    def _fire(self, entry: CronEntry, slot: datetime, missed: bool) -> CronFire:
        event: dict[str, JSON] = {
            "name": entry.name, "slot": slot.isoformat(),
            "slot_local": entry.schedule.local(slot).isoformat(),
            "schedule": entry.expression, "timezone": entry.timezone,
        }
        if missed:
            event["missed"] = True  # fired late: the latest missed slot, or caught up
        return CronFire(entry.name, slot, NewExecution(
            ffqn=entry.ffqn, params=list(entry.params), deployment_id=self.deployment_id,
            id=new_execution_id()), event)

    def _account(self, tick: CronTick, decisions: dict[str, Due]) -> None:
        """Metrics and log lines, once the slots are written."""
        for f in tick.started:
            late = (tick.now - f.slot_at).total_seconds()
            self.metrics.fired.labels(f.name).inc()
            self.metrics.lateness.observe(max(late, 0.0))
            log.info("started slot %s of %s: execution %s", f.slot_at.isoformat(), f.name,
                     f.execution.id,
                     extra={**DOMAIN, "cron": f.name, "slot": f.slot_at.isoformat(),
                            "slot_local": f.event.get("slot_local"),
                            "execution_id": str(f.execution.id), "ffqn": f.execution.ffqn,
                            "late_seconds": round(late, 3),
                            "missed": bool(f.event.get("missed"))})
        for f in tick.taken:
            self.metrics.taken.labels(f.name).inc()
            log.debug("slot %s of %s was started by another server", f.slot_at.isoformat(),
                      f.name, extra={**DOMAIN, "cron": f.name, "slot": f.slot_at.isoformat()})
        for name, due in decisions.items():
            if not due.skipped:
                continue
            tick.skipped[name] = due.skipped
            if due.skipped_more:
                tick.skipped_more.add(name)
            self.metrics.skipped.labels(name).inc(due.skipped)
            count = f"more than {due.skipped}" if due.skipped_more else str(due.skipped)
            log.warning("%s: %s missed slot(s) skipped (no server started them in time)",
                        name, count,
                        extra={**DOMAIN, "cron": name, "skipped": due.skipped,
                               "skipped_more": due.skipped_more,
                               "fired": [s.isoformat() for s in due.fire]})

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set, sleeping until the next slot in between."""
        while not stop.is_set():
            began = time.monotonic()
            try:
                tick = await self.run_once()
            except Exception as exc:  # logged and counted; the loop goes on
                log.warning("tick failed: %s", exc, extra=DOMAIN)
                delay = ERROR_SLEEP
            else:
                delay = self.max_sleep
                if tick.next_slot is not None:
                    spent = time.monotonic() - began
                    # wake a moment after the slot by the database's clock
                    delay = (tick.next_slot - tick.now).total_seconds() - spent + 0.002
                delay = min(max(delay, 0.0), self.max_sleep)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass
