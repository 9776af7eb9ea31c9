"""Retention (docs/operations.md, Retention).

Terminal executions that ended longer ago than ``retention.terminal`` are deleted with
their history, messages and cron slots, a family at a time (a top-level execution and
everything below it), in batches of at most a few hundred executions (a family larger
than that a part at a time, its deepest members first), each its own short transaction
that locks only the ended rows it deletes: no worker ever waits on them on PostgreSQL.
What may go is :func:`veracity.core.retention.decide_prune`'s decision. Every server
runs it; one runner per tick across all of them (the single-runner lock); a busy lock
skips the tick.
``veracity prune`` runs the same on demand.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry, Counter

from veracity.config import MAX_RETENTION
from veracity.models import PruneBatch
from veracity.store.protocol import MaintenanceStore

log = logging.getLogger("veracity.retention")


@dataclass
class RetentionResult:
    ran: bool
    """False when another runner held the lock (the tick was skipped)"""
    dry_run: bool = False
    cutoff: datetime | None = None
    roots: int = 0
    executions: int = 0
    history: int = 0
    messages: int = 0
    kept: dict[str, int] = field(default_factory=dict)


class RetentionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.ticks = Counter("veracity_retention_ticks", "Retention ticks by outcome",
                             ["outcome"], registry=registry)
        self.deleted = Counter("veracity_retention_deleted",
                               "Rows deleted by retention, by kind", ["kind"],
                               registry=registry)
        for outcome in ("ran", "skipped_lock", "error"):
            self.ticks.labels(outcome)
        for kind in ("executions", "history", "messages"):
            self.deleted.labels(kind)


BATCH = {"postgresql": 500, "sqlite": 100}
"""Executions a batch deletes at most, by backend (docs/operations.md, Retention): on
SQLite every write holds the database's one write lock, so its batches are smaller."""


class RetentionService:
    name = "retention"

    def __init__(
        self,
        store: MaintenanceStore,
        *,
        older_than: float,
        batch: int | None = None,
        metrics: RetentionMetrics | None = None,
    ) -> None:
        if older_than <= 0:
            raise ValueError("retention needs a duration above 0 (0 keeps everything)")
        if older_than > MAX_RETENTION:
            raise ValueError("retention is at most 36500d (100 years)")
        if batch is None:
            batch = BATCH.get(store.backend, 500)
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.store = store
        self.older_than = older_than
        self.batch = batch
        self.metrics = metrics

    async def cutoff(self) -> datetime:
        """Now by the database's clock, less ``older_than``."""
        return await self.store.db_now() - timedelta(seconds=self.older_than)

    async def run_once(
        self, *, dry_run: bool = False, cutoff: datetime | None = None,
        on_batch: Callable[[PruneBatch], None] | None = None,
    ) -> RetentionResult:
        """One pass over every top-level execution that ended before the cutoff (by
        default :meth:`cutoff`), a batch at a time. A pass that fails counts
        ``outcome="error"`` and raises; batches committed before stay deleted."""
        try:
            return await self._tick(dry_run, cutoff, on_batch)
        except Exception:
            self._count_tick("error")
            raise

    async def _tick(
        self, dry_run: bool, cutoff: datetime | None,
        on_batch: Callable[[PruneBatch], None] | None,
    ) -> RetentionResult:
        async with self.store.single_runner(self.name) as acquired:
            if not acquired:
                self._count_tick("skipped_lock")
                log.info("tick skipped: another runner holds the lock",
                         extra={"domain": self.name})
                return RetentionResult(ran=False, dry_run=dry_run)
            if cutoff is None:
                cutoff = await self.cutoff()
            result = RetentionResult(ran=True, dry_run=dry_run, cutoff=cutoff)
            after: tuple[datetime, uuid.UUID] | None = None
            rest: tuple[uuid.UUID, ...] = ()  # a large family's next parts
            while True:
                batch = await self.store.execution_prune(
                    cutoff=cutoff, limit=self.batch, after=after, dry_run=dry_run,
                    rest=rest)
                after = batch.cursor if batch.cursor is not None else after
                rest = batch.rest
                result.roots += batch.roots
                result.executions += batch.executions
                result.history += batch.history
                result.messages += batch.messages
                for reason, n in batch.kept.items():
                    result.kept[reason] = result.kept.get(reason, 0) + n
                if self.metrics is not None and not dry_run:
                    self.metrics.deleted.labels("executions").inc(batch.executions)
                    self.metrics.deleted.labels("history").inc(batch.history)
                    self.metrics.deleted.labels("messages").inc(batch.messages)
                if on_batch is not None:
                    on_batch(batch)
                if not batch.more:
                    break
            self._count_tick("ran")
            if result.executions or result.kept:
                log.info(
                    "%s %d executions that ended before %s",
                    "would delete" if dry_run else "deleted", result.executions,
                    cutoff.isoformat(),
                    extra={"domain": self.name, "executions": result.executions,
                           "history": result.history, "messages": result.messages,
                           "kept": result.kept, "dry_run": dry_run},
                )
            return result

    def _count_tick(self, outcome: str) -> None:
        if self.metrics:
            self.metrics.ticks.labels(outcome).inc()
