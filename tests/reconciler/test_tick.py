"""How one tick goes: every running delegated execution examined once across pages, engine
calls concurrent up to the bound, and the reconciler always on with the documented
defaults."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.reconciler._support import SLOW, Rig, wait_status
from veracity.config import ReconcilerSettings, Settings, load_settings
from veracity.core.states import Status
from veracity.maintenance.reconciler import ReconcilerService
from veracity.maintenance.recovery import RecoveryService
from veracity.store import open_store
from veracity.testing.fake_n8n import Script

pytestmark = pytest.mark.timeout(60)


async def test_pages_examine_every_execution_once(rig: Rig) -> None:
    finished = [await rig.start(Script(outcome="success", callback="lose"), SLOW)
                for _ in range(5)]
    quiet = [await rig.start(Script.forever(callback="lose"), SLOW) for _ in range(2)]
    no_id = await rig.delegate_only(SLOW)
    for s in finished:
        await wait_status(rig, s.run_id, "success")

    result = await rig.tick(page_size=2)

    assert result.examined == 8
    assert rig.sample("veracity_reconciler_executions_examined_total") == 8
    assert sorted(a.kind for a in result.actions) == ["flag"] + ["terminate"] * 5
    assert len({a.execution_id for a in result.actions}) == 6
    for s in finished:
        assert (await rig.get(s.id)).status == Status.FAILED_TRANSIENT
    for s in quiet:
        assert (await rig.get(s.id)).status == Status.RUNNING
    assert (await rig.get(no_id)).flagged_at is not None
    await rig.assert_truthful()


async def test_engine_calls_run_concurrently_up_to_the_bound(rig: Rig) -> None:
    for _ in range(4):
        await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.latency = 0.3

    started = time.monotonic()
    await rig.tick(concurrency=1)
    sequential = time.monotonic() - started
    started = time.monotonic()
    await rig.tick(concurrency=4)
    concurrent = time.monotonic() - started

    assert sequential >= 4 * 0.3, sequential
    assert concurrent < 2 * 0.3 + 0.3, concurrent


def test_always_on_with_the_documented_defaults() -> None:
    defaults = Settings().reconciler
    assert defaults.interval == 120 and defaults.concurrency == 16
    assert set(ReconcilerSettings.model_fields) == {
        "interval", "concurrency", "engine_timeout", "stop_flag_after"}
    assert defaults.stop_flag_after == 600
    assert load_settings(env={"VERACITY_RECONCILER_INTERVAL": "2.5"}).reconciler.interval == 2.5
    assert ReconcilerService.__init__.__kwdefaults__ is not None
    assert ReconcilerService.__init__.__kwdefaults__["concurrency"] == 16


async def test_two_reconcilers_on_one_database_one_skips(rig: Rig, database_url: str) -> None:
    """The single-runner lock on both backends (SQLite: a file lock)."""
    for _ in range(2):
        await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.latency = 0.4
    other = await open_store(database_url, pool_size=2)
    try:
        second = ReconcilerService(other, {"n8n": rig.engine}, rig.external.limits)
        results = await asyncio.gather(rig.tick(), second.run_once())
    finally:
        await other.close()
    assert sorted(r.ran for r in results) == [False, True]
    assert rig.sample("veracity_reconciler_ticks_total", outcome="skipped_lock") + rig.sample(
        "veracity_reconciler_ticks_total", outcome="ran") == 1
    # once the tick is over the lock is free again
    assert (await rig.tick()).ran


async def test_other_services_do_not_wait_for_the_reconcilers_lock(rig: Rig) -> None:
    await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.latency = 0.6
    tick = asyncio.create_task(rig.tick())
    await asyncio.sleep(0.2)
    started = time.monotonic()
    recovery = await RecoveryService(rig.store, max_attempts=5).run_once()
    assert recovery.ran, "recovery has a lock of its own"
    assert time.monotonic() - started < 0.4
    assert not tick.done()
    assert (await tick).ran
