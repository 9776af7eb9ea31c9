"""Retention (RetentionService.run_once, docs/operations.md, Retention) on both backends:
a pass in batches, its metrics and log line, the single-runner lock, and bad settings.
Time is a :class:`ManualClock`; nothing sleeps."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from tests.maintenance.conftest import StoreFactory
from veracity.clock import ManualClock
from veracity.maintenance.retention import RetentionMetrics, RetentionService
from veracity.models import Claim, Execution, NewExecution
from veracity.store import Store

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DAY = 86400.0
FFQN = "test:retention/run.fn"


async def ended(store: Store) -> Execution:
    new = NewExecution(ffqn=FFQN, params=[], deployment_id="dep-r", id=uuid.uuid4())
    await store.execution_submit(new)
    (c,) = await store.execution_claim("w", [FFQN], limit=1, lease_ttl=timedelta(seconds=30))
    assert (await store.execution_complete_if_owned(Claim(c.id, "w", c.lease_epoch), 1)).applied
    e = await store.execution_get(c.id)
    assert e is not None
    return e


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = RetentionMetrics(self.registry)

    def ticks(self, outcome: str) -> float:
        return self.registry.get_sample_value(
            "veracity_retention_ticks_total", {"outcome": outcome}) or 0.0

    def deleted(self, kind: str) -> float:
        return self.registry.get_sample_value(
            "veracity_retention_deleted_total", {"kind": kind}) or 0.0


async def test_a_pass_deletes_in_batches_counts_and_logs(
    store: Store, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    clock.set(T0)
    olds = [await ended(store) for _ in range(5)]
    pending = (await store.execution_submit(NewExecution(
        ffqn=FFQN, params=[], deployment_id="dep-r", id=uuid.uuid4()))).execution
    clock.set(T0 + timedelta(days=8))
    fresh = await ended(store)
    m = Metrics()
    service = RetentionService(store, older_than=7 * DAY, batch=2, metrics=m.metrics)
    batches: list[int] = []
    with caplog.at_level(logging.INFO, logger="veracity.retention"):
        result = await service.run_once(on_batch=lambda b: batches.append(b.executions))
    assert result.ran and result.cutoff == T0 + timedelta(days=1)
    assert batches == [2, 2, 1]
    assert (result.executions, result.history, result.messages) == (5, 15, 0)
    for e in olds:
        assert await store.execution_get(e.id) is None
    assert await store.execution_get(pending.id) is not None
    assert await store.execution_get(fresh.id) is not None
    assert (m.ticks("ran"), m.deleted("executions"), m.deleted("history"),
            m.deleted("messages")) == (1, 5, 15, 0)
    (line,) = [r for r in caplog.records if r.name == "veracity.retention"]
    assert line.getMessage().startswith("deleted 5 executions that ended before 2030-01-02")
    assert vars(line)["history"] == 15

    # a dry run counts, deletes nothing and adds nothing to the metrics
    clock.set(T0 + timedelta(days=20))
    counted = await service.run_once(dry_run=True)
    assert (counted.executions, counted.dry_run) == (1, True)
    assert await store.execution_get(fresh.id) is not None
    assert m.deleted("executions") == 5 and m.ticks("ran") == 2


async def test_a_busy_lock_skips_the_pass_and_deletes_nothing(
    store: Store, clock: ManualClock, other_store: StoreFactory
) -> None:
    clock.set(T0)
    old = await ended(store)
    clock.set(T0 + timedelta(days=30))
    m = Metrics()
    service = RetentionService(store, older_than=DAY, metrics=m.metrics)
    other = await other_store()
    async with other.single_runner("retention") as held:
        assert held
        skipped = await service.run_once()
        assert not skipped.ran and skipped.executions == 0
        assert await store.execution_get(old.id) is not None
        assert m.ticks("skipped_lock") == 1 and m.ticks("ran") == 0
    assert (await service.run_once()).executions == 1
    assert m.ticks("ran") == 1


@pytest.mark.parametrize(("older_than", "batch"), [(0.0, 10), (-1.0, 10), (DAY, 0)])
def test_bad_settings_are_refused(store: Store, older_than: float, batch: int) -> None:
    with pytest.raises(ValueError):
        RetentionService(store, older_than=older_than, batch=batch)
