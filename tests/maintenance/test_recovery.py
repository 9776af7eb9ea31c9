"""Lease recovery (RecoveryService.run_once) and the single-runner lock, on both backends.

Time is a :class:`ManualClock`: leases expire when the test says so, nothing sleeps.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from tests._helpers import get
from tests.maintenance.conftest import StoreFactory
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.maintenance.recovery import RecoveryMetrics, RecoveryService
from veracity.models import Claim, Execution, NewExecution, WorkerInfo
from veracity.store import Store, open_store

TTL = timedelta(seconds=30)
FFQN = "test:recovery/run.fn"


async def submit(store: Store, ffqn: str = FFQN) -> Execution:
    new = NewExecution(ffqn=ffqn, params=[], deployment_id="dep-r", id=uuid.uuid4())
    return (await store.execution_submit(new)).execution


async def claim_all(
    store: Store, owner: str = "worker-a", *, ttl: timedelta = TTL, limit: int = 100
) -> list[Claim]:
    claimed = await store.execution_claim(owner, [FFQN], limit=limit, lease_ttl=ttl)
    return [Claim(e.id, owner, e.lease_epoch) for e in claimed]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = RecoveryMetrics(self.registry)

    def ticks(self, outcome: str) -> float:
        return self.registry.get_sample_value(
            "veracity_recovery_ticks_total", {"outcome": outcome}
        ) or 0.0

    def actions(self, action: str) -> float:
        return self.registry.get_sample_value(
            "veracity_recovery_actions_total", {"action": action}
        ) or 0.0


# -- recovery ------------------------------------------------------------------------------


async def test_expired_leases_go_back_to_pending(store: Store, clock: ManualClock) -> None:
    subs = [await submit(store) for _ in range(3)]
    claims = await claim_all(store)
    assert len(claims) == 3
    clock.advance(TTL + timedelta(seconds=1))
    m = Metrics()
    result = await RecoveryService(store, max_attempts=5, metrics=m.metrics).run_once()
    assert result.ran
    assert sorted(result.retried) == sorted(str(s.id) for s in subs)
    assert result.failed == []
    for c in claims:
        ex = await get(store, c.execution_id)
        assert ex.status == Status.PENDING
        assert ex.attempt == 2
        assert ex.lease_owner is None and ex.lease_expires_at is None
        assert ex.lease_epoch == c.epoch  # the next claim bumps it
        assert ex.error is None
        assert ex.updated_at == clock.now()
        history = await store.history_list(c.execution_id)
        assert [e.kind for e in history] == ["pending", "running", "pending"]
        assert [e.seq for e in history] == [1, 2, 3]
        last = history[-1]
        assert last.data["reason"] == "lease expired"
        assert last.data["owner"] == "worker-a"
        assert last.data["epoch"] == c.epoch
        assert last.data["attempt"] == 1
        assert last.data["max_attempts"] == 5
        assert last.at == clock.now()
    assert m.ticks("ran") == 1 and m.ticks("skipped_lock") == 0
    assert m.actions("retry") == 3 and m.actions("failed_transient") == 0
    # recovered executions are claimable again, with a new epoch, and resume as attempt 2
    again = await store.execution_claim("worker-b", [FFQN], limit=10, lease_ttl=TTL)
    assert {e.id for e in again} == {c.execution_id for c in claims}
    for e in again:
        assert e.attempt == 2
        assert e.lease_epoch > next(c.epoch for c in claims if c.execution_id == e.id)


async def test_old_owner_is_fenced_out_after_recovery(store: Store, clock: ManualClock) -> None:
    await submit(store)
    (c,) = await claim_all(store)
    clock.advance(TTL)
    await RecoveryService(store).run_once()
    refused = await store.execution_complete_if_owned(c, {"late": True})
    assert not refused.applied
    ex = await get(store, c.execution_id)
    assert ex.status == Status.PENDING and ex.result is None
    kinds = [e.kind for e in await store.history_list(c.execution_id)]
    assert kinds == ["pending", "running", "pending", "late_report"]


async def test_lease_expiring_exactly_now_is_recovered(store: Store, clock: ManualClock) -> None:
    """The fenced writes need ``lease_expires_at > now``; recovery takes ``<= now``: no
    instant at which both or neither may act."""
    await submit(store)
    (c,) = await claim_all(store)
    clock.advance(TTL)
    assert not (await store.execution_checkpoint_if_owned(c, "step_completed", {"pos": 0})).applied
    result = await RecoveryService(store).run_once()
    assert result.retried == [str(c.execution_id)]


async def test_after_max_attempts_the_execution_fails_transient(
    store: Store, clock: ManualClock
) -> None:
    sub = await submit(store)
    m = Metrics()
    service = RecoveryService(store, max_attempts=3, metrics=m.metrics)
    epochs = []
    for attempt in (1, 2):
        (c,) = await claim_all(store, f"worker-{attempt}")
        epochs.append(c.epoch)
        clock.advance(TTL * 2)
        result = await service.run_once()
        assert result.retried == [str(sub.id)] and result.failed == []
        ex = await get(store, sub.id)
        assert ex.status == Status.PENDING and ex.attempt == attempt + 1

    (c,) = await claim_all(store, "worker-3")
    clock.advance(TTL * 2)
    result = await service.run_once()
    assert result.ran
    assert result.retried == []
    assert result.failed == [str(sub.id)]
    ex = await get(store, sub.id)
    assert ex.status == Status.FAILED_TRANSIENT
    assert ex.attempt == 3
    assert ex.lease_owner is None and ex.lease_expires_at is None
    assert ex.result is None
    assert ex.error["code"] == "lease_expired"
    assert "worker-3" in ex.error["message"]
    assert "3" in ex.error["message"]
    last = (await store.history_list(sub.id))[-1]
    assert last.kind == "failed_transient"
    assert last.data["reason"] == "lease expired"
    assert last.data["owner"] == "worker-3"
    assert last.data["epoch"] == c.epoch
    assert last.data["attempt"] == 3
    assert m.actions("retry") == 2 and m.actions("failed_transient") == 1
    assert m.ticks("ran") == 3

    # terminal: never claimed again, never touched by recovery again
    assert await claim_all(store, "worker-4") == []
    clock.advance(TTL * 10)
    again = await service.run_once()
    assert again.ran and again.retried == [] and again.failed == []
    assert (await get(store, sub.id)).history_seq == ex.history_seq


async def test_max_attempts_one_fails_on_the_first_expiry(
    store: Store, clock: ManualClock
) -> None:
    sub = await submit(store)
    await claim_all(store)
    clock.advance(TTL)
    result = await RecoveryService(store, max_attempts=1).run_once()
    assert result.failed == [str(sub.id)]
    ex = await get(store, sub.id)
    assert ex.status == Status.FAILED_TRANSIENT and ex.attempt == 1


async def test_the_default_attempt_limit_is_the_documented_five(
    store: Store, clock: ManualClock
) -> None:
    """Guards RecoveryService's default max_attempts: it is the documented default of
    ``recovery.max_attempts`` (README, docs/workers.md): four expiries go back to pending,
    the fifth ends failed_transient."""
    sub = await submit(store)
    service = RecoveryService(store)
    for attempt in range(1, 6):
        await claim_all(store, f"worker-{attempt}")
        clock.advance(TTL * 2)
        result = await service.run_once()
        ex = await get(store, sub.id)
        if attempt < 5:  # back to pending for its next attempt
            assert result.retried == [str(sub.id)]
            assert ex.status == Status.PENDING and ex.attempt == attempt + 1
    assert result.failed == [str(sub.id)]
    assert ex.status == Status.FAILED_TRANSIENT and ex.attempt == 5


async def test_the_service_options_are_keyword_only(store: Store) -> None:
    """Guards the signature of RecoveryService: a bare number (attempts? batch size?) is
    refused, so no caller can pass one option for another."""
    with pytest.raises(TypeError):
        RecoveryService(store, 3)  # type: ignore[call-arg]
    assert RecoveryService(store, max_attempts=3, batch=10).batch == 10


async def test_unexpired_leases_are_untouched(store: Store, clock: ManualClock) -> None:
    await submit(store)
    (short,) = await claim_all(store, "worker-short", ttl=timedelta(seconds=10))
    await submit(store)
    (long,) = await claim_all(store, "worker-long", ttl=timedelta(seconds=60))
    before = await get(store, long.execution_id)

    clock.advance(9)
    nothing = await RecoveryService(store).run_once()
    assert nothing.ran and nothing.retried == [] and nothing.failed == []

    clock.advance(2)  # 11 s: only the short lease has expired
    result = await RecoveryService(store).run_once()
    assert result.retried == [str(short.execution_id)]
    after = await get(store, long.execution_id)
    assert after == before
    assert after.status == Status.RUNNING and after.lease_owner == "worker-long"
    # the holder of the unexpired lease carries on
    done = await store.execution_complete_if_owned(long, "fine")
    assert done.applied


async def test_renewed_leases_are_untouched(store: Store, clock: ManualClock) -> None:
    await submit(store)
    (c,) = await claim_all(store)
    clock.advance(TTL - timedelta(seconds=1))
    assert await store.lease_renew(c.owner, [c], TTL) == [c]
    clock.advance(TTL - timedelta(seconds=1))
    result = await RecoveryService(store).run_once()
    assert result.retried == []
    assert (await get(store, c.execution_id)).status == Status.RUNNING


async def test_executions_without_a_lease_are_untouched(
    store: Store, clock: ManualClock
) -> None:
    pending = await submit(store)
    await submit(store)
    await submit(store)
    claims = await claim_all(store, limit=2)
    assert (await store.execution_complete_if_owned(claims[0], {"ok": 1})).applied
    assert (await store.execution_fail_if_owned(claims[1], {"code": "x"})).applied
    later_pending = await submit(store)
    ids = [pending.id, later_pending.id, claims[0].execution_id, claims[1].execution_id]
    before = {i: await get(store, i) for i in ids}

    clock.advance(timedelta(days=30))
    result = await RecoveryService(store).run_once()
    assert result.ran and result.retried == [] and result.failed == []
    for i in ids:
        assert await get(store, i) == before[i]


async def test_runs_delegated_to_an_engine_are_untouched(
    store: Store, clock: ManualClock, database_url: str
) -> None:
    """A run delegated to an external engine is running without a lease: the reconciler's,
    never recovery's."""
    sub = await submit(store)
    await _raw(database_url, "UPDATE veracity_executions SET status = 'running', "
               "lease_owner = NULL, lease_expires_at = NULL WHERE id = ?", sub.id)
    before = await get(store, sub.id)
    assert before.status == Status.RUNNING and before.lease_owner is None
    clock.advance(timedelta(days=365))
    result = await RecoveryService(store).run_once()
    assert result.retried == [] and result.failed == []
    assert await get(store, sub.id) == before


async def test_many_expired_leases_are_recovered_in_batches_in_one_tick(
    store: Store, clock: ManualClock
) -> None:
    subs = [await submit(store) for _ in range(7)]
    await claim_all(store)
    clock.advance(TTL)
    result = await RecoveryService(store, batch=3).run_once()
    assert sorted(result.retried) == sorted(str(s.id) for s in subs)
    assert len(result.retried) == 7  # each once
    for s in subs:
        assert (await get(store, s.id)).status == Status.PENDING


async def test_recovery_of_an_empty_database(store: Store) -> None:
    m = Metrics()
    result = await RecoveryService(store, metrics=m.metrics).run_once()
    assert result.ran and result.retried == [] and result.failed == []
    assert m.ticks("ran") == 1


def test_every_tick_outcome_is_exported_from_the_start() -> None:
    """``veracity_recovery_ticks_total`` has its three series (docs/workers.md) at 0 before
    the first tick: an alert on the ``error`` series, or a rate of ``skipped_lock``, has a
    series to read before the first such tick happens."""
    registry = CollectorRegistry()
    RecoveryMetrics(registry)
    for outcome in ("ran", "skipped_lock", "error"):
        value = registry.get_sample_value("veracity_recovery_ticks_total", {"outcome": outcome})
        assert value == 0.0, outcome


async def test_service_without_metrics_counts_nothing_and_works(
    store: Store, clock: ManualClock
) -> None:
    await submit(store)
    await claim_all(store)
    clock.advance(TTL)
    assert len((await RecoveryService(store, metrics=None).run_once()).retried) == 1


# -- one runner per tick ---------------------------------------------------------------------


async def test_a_busy_lock_skips_the_tick_and_changes_nothing(
    store: Store, clock: ManualClock, other_store: StoreFactory
) -> None:
    sub = await submit(store)
    await claim_all(store)
    clock.advance(TTL * 2)
    before = await get(store, sub.id)
    m = Metrics()
    service = RecoveryService(store, metrics=m.metrics)

    other = await other_store()
    async with other.single_runner("recovery") as held:
        assert held
        skipped = await service.run_once()
        assert not skipped.ran
        assert skipped.retried == [] and skipped.failed == []
        assert await get(store, sub.id) == before
        assert m.ticks("skipped_lock") == 1 and m.ticks("ran") == 0
        assert m.actions("retry") == 0

    result = await service.run_once()
    assert result.ran and result.retried == [str(sub.id)]
    assert m.ticks("skipped_lock") == 1 and m.ticks("ran") == 1
    assert m.actions("retry") == 1


async def test_a_lock_of_another_service_does_not_block_recovery(
    store: Store, other_store: StoreFactory
) -> None:
    other = await other_store()
    async with other.single_runner("reconciler") as held:
        assert held
        assert (await RecoveryService(store).run_once()).ran


async def test_concurrent_ticks_never_both_run(
    store: Store, clock: ManualClock, other_store: StoreFactory
) -> None:
    """Two servers ticking at the same moment: each expired execution is recovered once."""
    subs = [await submit(store) for _ in range(20)]
    await claim_all(store)
    clock.advance(TTL)
    services = [RecoveryService(store)] + [RecoveryService(await other_store()) for _ in range(3)]
    results = await asyncio.gather(*(s.run_once() for s in services))
    recovered = [i for r in results for i in r.retried]
    assert sorted(recovered) == sorted(str(s.id) for s in subs)
    for s in subs:
        history = await store.history_list(s.id)
        assert [e.kind for e in history] == ["pending", "running", "pending"]


async def test_single_runner_is_exclusive_and_released(
    store: Store, other_store: StoreFactory
) -> None:
    other = await other_store()
    async with store.single_runner("tick") as first:
        assert bool(first) is True
        async with other.single_runner("tick") as second:
            assert bool(second) is False
        async with store.single_runner("tick") as same_store:
            assert bool(same_store) is False  # a second tick of the same process, too
        async with other.single_runner("another") as unrelated:
            assert bool(unrelated) is True
    async with other.single_runner("tick") as after:
        assert bool(after) is True
    async with store.single_runner("tick") as again:
        assert bool(again) is True


async def test_single_runner_is_released_when_the_tick_raises(
    store: Store, other_store: StoreFactory
) -> None:
    other = await other_store()
    with pytest.raises(RuntimeError, match="tick failed"):
        async with store.single_runner("tick") as got:
            assert got
            raise RuntimeError("tick failed")
    async with other.single_runner("tick") as after:
        assert bool(after) is True


async def test_single_runner_is_released_when_the_tick_is_cancelled(
    store: Store, other_store: StoreFactory
) -> None:
    entered = asyncio.Event()

    async def tick() -> None:
        async with store.single_runner("tick") as got:
            assert got
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(tick())
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    other = await other_store()
    async with other.single_runner("tick") as after:
        assert bool(after) is True


@asynccontextmanager
async def opened(url: str, clock: ManualClock) -> AsyncIterator[Store]:
    st = await open_store(url, clock=clock, pool_size=2)
    try:
        yield st
    finally:
        await st.close()


async def test_a_long_tick_keeps_its_lock(
    store: Store, clock: ManualClock, other_store: StoreFactory
) -> None:
    """However long a tick takes (hours, by the store's clock), its lock is not taken
    over: the lock lives as long as its holder, not for a fixed time."""
    other = await other_store()
    async with store.single_runner("recovery") as held:
        assert held
        clock.advance(timedelta(hours=6))
        async with other.single_runner("recovery") as second:
            assert bool(second) is False
        assert not (await RecoveryService(other).run_once()).ran


async def test_sqlite_lock_is_per_database(tmp_path: Path) -> None:
    """Two SQLite databases in one folder do not share their locks."""
    from tests.conftest import migrate

    urls = [f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"]
    for url in urls:
        await asyncio.to_thread(migrate, url)
    clock = ManualClock()
    async with opened(urls[0], clock) as a, opened(urls[1], clock) as b:
        async with a.single_runner("recovery") as got_a, b.single_runner("recovery") as got_b:
            assert got_a and got_b


async def test_postgres_lock_connection_killed_mid_tick(pg_url: str) -> None:
    clock = ManualClock()
    async with opened(pg_url, clock) as store, opened(pg_url, clock) as other:
        async with store.single_runner("recovery") as held:
            assert held
            assert await _terminate_lock_holders(pg_url) == 1
            # the session is gone, and its lock with it
            async with other.single_runner("recovery") as meanwhile:
                assert bool(meanwhile) is True
        # leaving the tick whose connection died did not raise; the lock is free
        async with store.single_runner("recovery") as again:
            assert bool(again) is True
        assert (await RecoveryService(store).run_once()).ran


async def test_postgres_recovery_tick_survives_a_killed_lock_connection(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock's connection dies during the tick: the tick's work (on the pool) still
    completes, the tick does not raise, and the next tick runs."""
    clock = ManualClock()
    async with opened(pg_url, clock) as store:
        sub = await submit(store)
        await claim_all(store)
        clock.advance(TTL)
        original = store.execution_recover_expired

        async def kill_then_recover(**kwargs: Any) -> Any:
            assert await _terminate_lock_holders(pg_url) == 1
            return await original(**kwargs)

        monkeypatch.setattr(store, "execution_recover_expired", kill_then_recover)
        result = await RecoveryService(store).run_once()
        assert result.ran and result.retried == [str(sub.id)]
        monkeypatch.undo()
        assert (await RecoveryService(store).run_once()).ran


# -- raw SQL helpers ------------------------------------------------------------------------------


async def _terminate_lock_holders(database_url: str) -> int:
    """Kill the backends of this database that took an advisory lock (the lock holder's
    connection shows its last statement, ``SELECT pg_try_advisory_lock(...)``). The timeout
    form waits until the backend has exited: the plain form only signals it, and the lock
    would still be held for a moment after it returns."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND query ILIKE '%pg_try_advisory_lock%'"
        )
        rows = await cur.fetchall()
        return sum(1 for (ok,) in rows if ok)


async def _raw(database_url: str, sql: str, *params: Any) -> None:
    if database_url.startswith("postgresql"):
        pg_sql: Any = sql.replace("?", "%s")
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(pg_sql, params)
        return
    path = database_url.removeprefix("sqlite:///")

    def run() -> None:
        conn = sqlite3.connect(path, timeout=30)
        try:
            conn.execute(sql, tuple(str(p) if isinstance(p, uuid.UUID) else p for p in params))
            conn.commit()
        finally:
            conn.close()

    await asyncio.to_thread(run)


# -- a worker whose process is gone (docs/workers.md) -----------------------------------------

HERE = "boot-1/pid:[7]"


async def test_a_tick_ends_the_leases_of_a_gone_worker_on_this_host_and_recovers_them(
    store: Store, clock: ManualClock
) -> None:
    def registered(worker_id: str, pid: int, key: str | None) -> WorkerInfo:
        return WorkerInfo(id=worker_id, host="h", pid=pid, deployment_id="dep-r",
                          ffqns=[FFQN], concurrency=4, host_key=key)

    await store.worker_register(registered("dead", 4001, HERE))
    await store.worker_register(registered("alive", 4002, HERE))
    await store.worker_register(registered("elsewhere", 4003, "boot-2/pid:[7]"))
    held: dict[str, uuid.UUID] = {}
    for owner in ("dead", "alive", "elsewhere"):
        await submit(store)
        (claim,) = await claim_all(store, owner, limit=1)
        held[owner] = claim.execution_id
    asked: list[int] = []

    def pid_gone(pid: int) -> bool:
        asked.append(pid)
        return pid in (4001, 4003)  # 4003 is on another host: never asked

    m = Metrics()
    no_key = await RecoveryService(store, metrics=m.metrics, pid_gone=pid_gone).run_once()
    assert (no_key.retried, no_key.gone_workers, asked) == ([], [], [])
    service = RecoveryService(store, metrics=m.metrics, host_key=HERE, pid_gone=pid_gone)
    result = await service.run_once()
    assert result.gone_workers == ["dead"]
    assert sorted(asked) == [4001, 4002]
    assert result.retried == [str(held["dead"])]
    recovered = await get(store, held["dead"])
    assert (recovered.status, recovered.attempt) == (Status.PENDING, 2)
    for owner in ("alive", "elsewhere"):  # their leases hold
        kept = await get(store, held[owner])
        assert (kept.status, kept.lease_owner) == (Status.RUNNING, owner)
    assert m.registry.get_sample_value("veracity_recovery_gone_worker_leases_total") == 1.0
    assert m.actions("retry") == 1.0
    again = await service.run_once()  # marked stopped: not found gone twice
    assert (again.gone_workers, again.retried) == ([], [])


async def test_a_process_without_the_lock_still_ends_a_gone_workers_leases(
    store: Store, other_store: StoreFactory, clock: ManualClock
) -> None:
    """The gone check runs before the lock: a process whose tick is skipped ends the leases
    all the same, and the lock holder's next tick recovers the executions."""
    await store.worker_register(WorkerInfo(id="dead", host="h", pid=4001,
                                           deployment_id="dep-r", ffqns=[FFQN],
                                           concurrency=4, host_key=HERE))
    await submit(store)
    (claim,) = await claim_all(store, "dead", limit=1)
    other = await other_store()
    holder = RecoveryService(other)
    async with other.single_runner("recovery") as held:
        assert held
        skipped = await RecoveryService(store, host_key=HERE,
                                        pid_gone=lambda pid: True).run_once()
    assert (skipped.ran, skipped.gone_workers) == (False, ["dead"])
    ended = await get(store, claim.execution_id)
    assert (ended.status, ended.lease_expires_at) == (Status.RUNNING, clock.now())
    result = await holder.run_once()  # no host key: it recovers what the other one ended
    assert result.retried == [str(claim.execution_id)]
