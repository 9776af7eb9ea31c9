"""The external-execution reconciler (seed 000).

It exists to uphold one invariant: never mark an execution terminal while its engine may
still be running it. Each tick, under a single-runner lock (PostgreSQL: a session advisory
lock on a connection of its own, skip the tick if busy, released in ``finally``, the
connection closed if unlocking fails; SQLite: a file lock), it reads every running
execution delegated to an engine, asks the engine about each (concurrently, bounded, each
call with a timeout, no database transaction open meanwhile), decides with the pure table
of :mod:`veracity.core.reconcile`, and writes the outcome in one transaction per page. It
only ever produces ``failed_transient`` or a flag for an operator — never ``completed``,
which needs the result payload only ``/complete`` delivers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from veracity.core.reconcile import Action, EngineState, decide, limit_breached
from veracity.engines.base import Engine, Inspection
from veracity.models import Execution, ReconcileAction
from veracity.store._common import RunnerLock
from veracity.store.protocol import Store

log = logging.getLogger("veracity.reconciler")
DOMAIN = {"domain": "reconciler"}
ACTION_KINDS = ("terminate", "flag", "stop")
"""``veracity_reconciler_actions_total`` kinds: an execution ended ``failed_transient``
locally, flagged for an operator, or a remote stop requested from its engine."""


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
        store: Store,
        engines: Mapping[str, Engine],
        limits: Mapping[str, float | None],
        *,
        concurrency: int = 16,
        engine_timeout: float = 10.0,
        page_size: int = 1000,
        metrics: ReconcilerMetrics | None = None,
        trigger_grace: Mapping[str, float] | None = None,
    ) -> None:
        self.store = store
        self.engines = engines
        self.limits = limits
        self.concurrency = concurrency
        self.engine_timeout = engine_timeout
        self.page_size = page_size
        self.trigger_grace = dict(trigger_grace or {})
        """Per engine, how long after its trigger an execution without an external id may
        still be waiting for the engine's answer (the engine's own call timeout): until
        then the missing id is not news, and nobody is flagged for it."""
        self.metrics = metrics or ReconcilerMetrics(CollectorRegistry())
        self._lock: RunnerLock | None = None

    async def run_once(self) -> TickResult:
        async with self.store.single_runner(self.name) as lock:
            if not lock:
                self.metrics.ticks.labels("skipped_lock").inc()
                log.info("tick skipped: another runner holds the lock", extra=DOMAIN)
                return TickResult(ran=False)
            started = time.monotonic()
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
            decided = await asyncio.gather(
                *(self._examine(e, now, gate, result) for e in page))
            actions = [a for a in decided if a is not None]
            await self._still_ours()
            applied = await self.store.execution_reconcile_apply(actions)
            for action in applied:
                self.metrics.actions.labels(action.kind).inc()
                log.warning(
                    "%s: %s", action.kind, action.reason,
                    extra={**DOMAIN, "action": action.kind,
                           "execution_id": str(action.execution_id),
                           "external_execution_id": action.external_execution_id,
                           **{f"detail_{k}": v for k, v in action.data.items()}})
            result.actions.extend(applied)
            if len(page) < self.page_size:
                break
        return result

    async def _inspect(self, engine: Engine, external_id: str,
                       result: TickResult) -> Inspection | None:
        try:
            inspection = await asyncio.wait_for(engine.inspect(external_id),
                                                self.engine_timeout)
        except TimeoutError:
            self._engine_error("timeout", result)
            return None
        except Exception as exc:  # an adapter must not crash the loop, whatever it does
            self._engine_error("adapter_error", result)
            log.warning("engine adapter raised: %s", exc, extra=DOMAIN)
            return None
        if inspection.error:
            self._engine_error(inspection.error, result)
        return inspection

    def _engine_error(self, kind: str, result: TickResult) -> None:
        result.engine_errors += 1
        self.metrics.engine_errors.labels(kind).inc()

    async def _examine(self, e: Execution, now: datetime, gate: asyncio.Semaphore,
                       result: TickResult) -> ReconcileAction | None:
        limit = self.limits.get(e.ffqn)
        breached = (
            limit is not None and e.triggered_at is not None
            and limit_breached(e.triggered_at, timedelta(seconds=limit), now)
        )
        data: dict[str, Any] = {"engine": e.engine, "limit_breached": breached}
        if e.external_execution_id is None:
            grace = timedelta(seconds=self.trigger_grace.get(e.engine or "", 0.0))
            if e.triggered_at is not None and now < e.triggered_at + grace:
                return None  # its trigger may still be on its way: nothing is known yet
            decision = decide(False, breached, EngineState.UNKNOWN)
            return self._action(e, decision.action,
                                "no external id: whether the engine started the run is "
                                "unknown; attach its id or end the run", data)
        engine = self.engines.get(e.engine or "")
        if engine is None:
            return self._action(e, Action.FLAG, f"engine {e.engine!r} is not configured",
                                data)
        async with gate:
            inspection = await self._inspect(engine, e.external_execution_id, result)
            state = inspection.state if inspection else EngineState.UNKNOWN
            if inspection is not None:
                data.update(engine_status=inspection.status,
                            engine_stopped_at=inspection.stopped_at)
            decision = decide(True, breached, state)
            if inspection is not None and inspection.needs_operator:
                what = ("does not know" if inspection.not_found else "refuses")
                return self._action(
                    e, Action.FLAG, f"the engine {what} external id "
                    f"{e.external_execution_id} ({inspection.error}); left running", data)
            if decision.action == Action.STOP_REMOTE:
                await self._still_ours()  # never stop a run under a lock we lost
                result.stops_requested += 1
                self.metrics.actions.labels("stop").inc()
                stopped = await self._stop(engine, e.external_execution_id, result)
                # whatever the stop answered, decide from what the engine now says
                again = await self._inspect(engine, e.external_execution_id, result)
                finished = again is not None and again.state == EngineState.FINISHED
                self._log_stop(e, stopped, again, finished)
                if again is not None:
                    data.update(engine_status=again.status,
                                engine_stopped_at=again.stopped_at, stop=stopped)
                    if finished:
                        return self._action(e, Action.TERMINATE_LOCAL,
                                            "limit breached; the engine stopped the run",
                                            data)
                return None
        if decision.action == Action.FLAG:
            return self._action(e, Action.FLAG, decision.reason, data)
        return self._action(e, decision.action, decision.reason, data)

    @staticmethod
    def _log_stop(e: Execution, stopped: str, again: Inspection | None,
                  finished: bool) -> None:
        """The JSON log line of a remote stop request (an action of kind ``stop``)."""
        outcome = ("the engine confirms the run finished" if finished
                   else "the engine has not stopped the run yet")
        log.warning(
            "stop: limit breached; asked the engine to stop run %s (%s); %s",
            e.external_execution_id, stopped, outcome,
            extra={**DOMAIN, "action": "stop", "execution_id": str(e.id),
                   "external_execution_id": e.external_execution_id,
                   "engine": e.engine, "stop": stopped, "engine_finished": finished,
                   "engine_status": again.status if again is not None else None})

    async def _still_ours(self) -> None:
        if self._lock is not None and not await self._lock.held():
            log.warning("the tick lost its lock; stopping without acting", extra=DOMAIN)
            raise LockLost("the reconciler lock was lost during the tick")

    async def _stop(self, engine: Engine, external_id: str, result: TickResult) -> str:
        try:
            outcome = await asyncio.wait_for(engine.stop(external_id), self.engine_timeout)
        except TimeoutError:
            self._engine_error("stop_timeout", result)
            return "timeout"
        except Exception as exc:
            self._engine_error("stop_error", result)
            return f"error: {exc}"
        if not outcome.ok:
            self._engine_error("stop_failed", result)
            return f"failed: {outcome.reason}"
        return "ok"

    @staticmethod
    def _action(e: Execution, action: Action, reason: str,
                data: dict[str, Any]) -> ReconcileAction | None:
        if action == Action.TERMINATE_LOCAL:
            return ReconcileAction(e.id, e.external_execution_id, "terminate", reason, data)
        if action == Action.FLAG:
            return ReconcileAction(e.id, e.external_execution_id, "flag", reason, data)
        return None
