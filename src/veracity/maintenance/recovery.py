"""Lease recovery (docs/workers.md).

Executions whose lease expired go back to ``pending`` with ``attempt + 1`` (their next run
resumes from the checkpoints) or, once ``attempt >= max_attempts``, end ``failed_transient``
(a cancel requested meanwhile is carried out instead): the decision is
:func:`veracity.core.recovery.decide_recovery`'s, applied by the store only while the
expired lease is still the one it looked at; the owner is cleared and the reason recorded
in history. One runner per tick across all
servers (PostgreSQL advisory lock; an exclusive file lock on SQLite); a busy lock skips the
tick.

Given this process's host key (:func:`veracity.host.host_key`), a tick first asks the
operating system about every worker registered with the same key, lock or no lock: the
leases of a worker whose process is gone (killed with -9, crashed) end at once, so the
tick that holds the lock, here or on any host, recovers its executions now instead of
when its leases would have expired (docs/workers.md, "A worker
whose process is gone"). A worker that is only frozen or slow still exists: its leases
decide, as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from veracity.core.recovery import RecoveryAction, Registered, gone_workers
from veracity.host import pid_gone
from veracity.store.protocol import MaintenanceStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from veracity.telemetry import Telemetry

log = logging.getLogger("veracity.recovery")


@dataclass
class RecoveryResult:
    ran: bool
    """False when another runner held the lock (the tick was skipped)."""
    retried: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    gone_workers: list[str] = field(default_factory=list)
    """Workers found gone from this host this tick (their leases ended at once)."""


class RecoveryMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import Counter  # a worker without metrics never loads it

        self.ticks = Counter("veracity_recovery_ticks", "Recovery ticks by outcome",
                             ["outcome"], registry=registry)
        self.actions = Counter("veracity_recovery_actions", "Executions recovered, by action",
                               ["action"], registry=registry)
        self.gone = Counter("veracity_recovery_gone_worker_leases",
                            "Leases ended at once because their worker's process was gone "
                            "from this host", registry=registry)
        for outcome in ("ran", "skipped_lock", "error"):
            self.ticks.labels(outcome)


class RecoveryService:
    name = "recovery"

    def __init__(
        self,
        store: MaintenanceStore,
        *,
        max_attempts: int = 5,
        batch: int = 1000,
        metrics: RecoveryMetrics | None = None,
        telemetry: Telemetry | None = None,
        host_key: str | None = None,
        pid_gone: Callable[[int], bool] = pid_gone,
    ) -> None:
        self.store = store
        self.host_key = host_key
        """This process's host key; None: workers are recovered by their leases only."""
        self.pid_gone = pid_gone
        self.telemetry = telemetry
        self.max_attempts = max_attempts
        self.batch = batch
        self.metrics = metrics

    async def run_once(self) -> RecoveryResult:
        """One tick. A tick that fails (the lock's connection cannot be opened, the
        database raises) counts ``outcome="error"`` and raises; the loop logs it."""
        try:
            return await self._tick()
        except Exception:
            self._count_tick("error")
            raise

    async def _tick(self) -> RecoveryResult:
        # the gone check needs no lock: each process judges only its own host's workers,
        # and ending a gone worker's leases is conditional (a second judge changes nothing)
        gone = await self._end_gone(self.host_key) if self.host_key is not None else []
        async with self.store.single_runner(self.name) as acquired:
            if not acquired:
                self._count_tick("skipped_lock")
                log.info("tick skipped: another runner holds the lock",
                         extra={"domain": self.name})
                return RecoveryResult(ran=False, gone_workers=gone)
            result = RecoveryResult(ran=True, gone_workers=gone)
            while True:
                recovered = await self.store.execution_recover_expired(
                    max_attempts=self.max_attempts, limit=self.batch
                )
                for item in recovered:
                    e = item.execution
                    {RecoveryAction.RETRY: result.retried,
                     RecoveryAction.FAILED_TRANSIENT: result.failed,
                     # a cancel requested before the lease expired: carried out
                     RecoveryAction.CANCEL: result.cancelled}[item.action].append(str(e.id))
                    if self.metrics:
                        self.metrics.actions.labels(str(item.action)).inc()
                    if self.telemetry is not None:
                        self.telemetry.end(e)  # failed_transient, cancelled; not a retry
                    log.warning(
                        "lease expired: %s", item.action,
                        extra={"domain": self.name, "execution_id": str(e.id),
                               "previous_owner": item.previous_owner,
                               "epoch": item.previous_epoch, "attempt": e.attempt,
                               "status": str(e.status)},
                    )
                if len(recovered) < self.batch:
                    break
            self._count_tick("ran")
            return result

    async def _end_gone(self, host_key: str) -> list[str]:
        """End the leases of this host's workers whose process is gone; their ids."""
        registered = [Registered(w.id, w.pid, w.host_key, w.stopped_at is not None)
                      for w in await self.store.worker_running_on(host_key)]
        gone = gone_workers(registered, host_key, os.getpid(), self.pid_gone)
        if not gone:
            return []
        ended = await self.store.worker_gone(host_key, [(w.id, w.pid) for w in gone])
        for w in gone:
            log.warning("worker %s is gone: its process %d no longer runs on this host; "
                        "its leases end now", w.id, w.pid,
                        extra={"domain": self.name, "worker_id": w.id, "pid": w.pid})
        if ended and self.metrics:
            self.metrics.gone.inc(ended)
        return [w.id for w in gone]

    def _count_tick(self, outcome: str) -> None:
        if self.metrics:
            self.metrics.ticks.labels(outcome).inc()
