"""The external-execution reconciler (docs/external.md).

It exists to uphold one rule: never mark an execution terminal while its engine may still
be running it. Each tick, under a single-runner lock (PostgreSQL: a session advisory lock
on a connection of its own, skip the tick if busy, released in ``finally``, the connection
closed if unlocking fails; SQLite: a file lock), it reads every running execution
delegated to an engine and takes a look at each (:mod:`veracity.adapters.looks`: the
engine asked by id, concurrently, bounded, each call with a timeout, no database
transaction open meanwhile; the decision is :func:`veracity.core.reconcile.decide`'s),
then writes the page's outcomes in one transaction. It only ever produces
``failed_transient``, ``cancelled`` (a cancel the engine confirmed), a flag for an
operator or the clearing of one — never ``completed``, which needs the result payload
only ``/complete`` delivers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram

from veracity.adapters.base import Engine
from veracity.adapters.looks import Look, Looker
from veracity.core.reconcile import DEFAULT_STOP_FLAG_AFTER, WriteKind
from veracity.models import Execution, ReconcileAction
from veracity.store import RunnerLock
from veracity.store.protocol import MaintenanceStore
from veracity.telemetry import Telemetry

log = logging.getLogger("veracity.reconciler")
DOMAIN = {"domain": "reconciler"}
ACTION_KINDS = ("terminate", "flag", "unflag", "stop")
"""``veracity_reconciler_actions_total`` kinds: an execution ended (``failed_transient``,
or ``cancelled`` for a confirmed cancel), flagged for an operator, its flag cleared, or a
remote stop requested from its engine."""


class LockLost(Exception):
    """The tick's lock went away under it (its session ended): stop acting at once."""


class ReconcilerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.ticks = Counter("veracity_reconciler_ticks", "Reconciler ticks by outcome",
                             ["outcome"], registry=registry)
        self.examined = Counter("veracity_reconciler_executions_examined",
                                "Running external executions examined", registry=registry)
        self.actions = Counter("veracity_reconciler_actions", "Actions taken, by kind",
                               ["kind"], registry=registry)
        self.engine_errors = Counter("veracity_reconciler_engine_errors",
                                     "Engine answers that were not usable, by kind",
                                     ["kind"], registry=registry)
        self.duration = Histogram("veracity_reconciler_tick_duration_seconds",
                                  "Duration of reconciler ticks that ran", registry=registry,
                                  buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120))
        for outcome in ("ran", "skipped_lock", "error"):
            self.ticks.labels(outcome)
        for kind in ACTION_KINDS:
            self.actions.labels(kind)


@dataclass
class TickResult:
    ran: bool
    examined: int = 0
    actions: list[ReconcileAction] = field(default_factory=list)
    stops_requested: int = 0
    engine_errors: int = 0
    lock_lost: bool = False
    """The lock went away during the tick, which then stopped without acting further."""


class ReconcilerService:
    name = "reconciler"

    def __init__(
        self,
        store: MaintenanceStore,
        engines: Mapping[str, Engine],
        limits: Mapping[str, float | None],
        *,
        concurrency: int = 16,
        engine_timeout: float = 10.0,
        page_size: int = 1000,
        metrics: ReconcilerMetrics | None = None,
        trigger_grace: Mapping[str, float] | None = None,
        stop_flag_after: float = DEFAULT_STOP_FLAG_AFTER.total_seconds(),
        looker: Looker | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.telemetry = telemetry
        self.looker = looker or Looker(engines, limits, engine_timeout=engine_timeout,
                                       trigger_grace=trigger_grace,
                                       stop_flag_after=stop_flag_after)
        self.concurrency = concurrency
        self.page_size = page_size
        self.metrics = metrics or ReconcilerMetrics(CollectorRegistry())
        self._lock: RunnerLock | None = None

    async def run_once(self) -> TickResult:
        """One tick. A tick that fails (the lock's connection cannot be opened, the
        database raises) counts ``outcome="error"`` and raises; the loop logs it."""
        started = time.monotonic()
        ran = False
        try:
            async with self.store.single_runner(self.name) as lock:
                if not lock:
                    self.metrics.ticks.labels("skipped_lock").inc()
                    log.info("tick skipped: another runner holds the lock", extra=DOMAIN)
                    return TickResult(ran=False)
                ran = True
                self._lock = lock
                try:
                    result = await self._tick()
                except LockLost:
                    # another runner may act now; this tick wrote nothing after the loss
                    self.metrics.ticks.labels("error").inc()
                    return TickResult(ran=True, lock_lost=True)
        except Exception:
            self.metrics.ticks.labels("error").inc()
            raise
        finally:
            self._lock = None
            if ran:
                self.metrics.duration.observe(time.monotonic() - started)
        self.metrics.ticks.labels("ran").inc()
        return result

    async def _tick(self) -> TickResult:
        result = TickResult(ran=True)
        now = await self.store.db_now()
        after = None
        gate = asyncio.Semaphore(self.concurrency)
        while True:
            page = await self.store.execution_external_running(limit=self.page_size,
                                                               after=after)
            if not page:
                break
            after = page[-1].id
            result.examined += len(page)
            self.metrics.examined.inc(len(page))
            looks = await self._look_all(page, now, gate, result)
            actions = [look.action for look in looks if look.action is not None]
            await self._still_ours()
            applied = await self.store.execution_reconcile_apply(actions)
            for action in applied:
                self._log_action(action)
            if self.telemetry is not None and applied:
                self._count(applied, {e.id: e for e in page}, await self.store.db_now())
            result.actions.extend(applied)
            if len(page) < self.page_size:
                break
        return result

    async def _look_all(self, page: list[Execution], now: datetime, gate: asyncio.Semaphore,
                        result: TickResult) -> list[Look]:
        """Every look of a page. Once one finds the lock lost, the others are cancelled:
        none may go on to ask the engine anything after the tick has ended."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._look(e, now, gate, result)) for e in page]
        except BaseExceptionGroup as failed:
            lost = failed.subgroup(LockLost)
            if lost is not None:
                raise lost.exceptions[0] from None
            raise failed.exceptions[0] from failed
        return [task.result() for task in tasks]

    async def _look(self, e: Execution, now: datetime, gate: asyncio.Semaphore,
                    result: TickResult) -> Look:
        async with gate:
            look = await self.looker.look(e, now, before_stop=self._stopping)
        for kind in look.engine_errors:
            result.engine_errors += 1
            self.metrics.engine_errors.labels(kind).inc()
        if look.stop is not None:
            result.stops_requested += 1
            self._log_stop(look)
        return look

    async def _stopping(self) -> None:
        await self._still_ours()  # never stop a run under a lock we lost
        self.metrics.actions.labels("stop").inc()

    def _count(self, applied: list[ReconcileAction], page: dict[uuid.UUID, Execution],
               now: datetime) -> None:
        assert self.telemetry is not None
        for action in applied:
            e = page.get(action.execution_id)
            if e is None:
                continue
            if action.kind is WriteKind.TERMINATE:
                self.telemetry.end_at(e.ffqn, action.to, e.started_at, now)
            elif action.kind is WriteKind.FLAG and action.flag is not None:
                self.telemetry.flagged("reconciler", str(action.flag))

    def _log_action(self, action: ReconcileAction) -> None:
        self.metrics.actions.labels(str(action.kind)).inc()
        extra = {**DOMAIN, "action": str(action.kind), "execution_id": str(action.execution_id),
                 "external_execution_id": action.external_execution_id,
                 **{f"detail_{k}": v for k, v in action.data.items()}}
        if action.kind is WriteKind.TERMINATE:
            extra["status"] = str(action.to)
        if action.flag is not None:
            extra["flag_kind"] = str(action.flag)
        log.warning("%s: %s", action.kind, action.reason, extra=extra)

    @staticmethod
    def _log_stop(look: Look) -> None:
        """The JSON log line of a remote stop request (an action of kind ``stop``)."""
        e = look.execution
        finished = look.decision.to is not None
        outcome = ("the engine confirms the run finished" if finished
                   else "the engine has not stopped the run yet")
        cause = look.decision.cause.words if look.decision.cause else "stop wanted"
        log.warning(
            "stop: %s; asked the engine to stop run %s (%s); %s",
            cause, e.external_execution_id, look.stop, outcome,
            extra={**DOMAIN, "action": "stop", "execution_id": str(e.id),
                   "external_execution_id": e.external_execution_id,
                   "engine": e.engine, "stop": look.stop, "engine_finished": finished,
                   "cause": str(look.decision.cause) if look.decision.cause else None,
                   "engine_status": look.inspection.status
                   if look.inspection is not None else None})

    async def _still_ours(self) -> None:
        if self._lock is None or not await self._lock.held():  # no lock: not ours
            log.warning("the tick lost its lock; stopping without acting", extra=DOMAIN)
            raise LockLost("the reconciler lock was lost during the tick")
