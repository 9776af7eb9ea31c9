"""PostgreSQL only: the reconciler's single-runner lock (a session advisory lock per tick,
skip the tick when busy). Two reconcilers on one database — two services in this process,
then two real ``veracity server`` processes — never tick at the same time and never act on
an execution twice; a lock whose connection is killed mid-tick is not left stuck.

Overlap is measured at the engine: each reconciler reaches the fake n8n under its own URL
prefix (/s0, /s1), and every engine request's span is recorded. A span ends when its answer
starts going out, before its reconciler can have seen it, let alone released the lock."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from tests.reconciler._support import (
    FAST,
    FAST_LIMIT,
    SLOW,
    Rig,
    Span,
    Tagged,
    config_toml,
    eventually,
    external_config,
    metric_value,
    server_processes,
    wait_status,
)
from veracity.adapters.n8n import N8nEngine
from veracity.core.states import Status
from veracity.maintenance._loop import run_forever
from veracity.maintenance.reconciler import ReconcilerMetrics, ReconcilerService
from veracity.store import Store, open_store
from veracity.testing.fake_n8n import Script

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[list[Store]]:
    opened = [await open_store(pg_url, pool_size=3) for _ in range(2)]
    try:
        yield opened
    finally:
        for s in opened:
            await s.close()


@dataclass
class Scenario:
    rig: Rig
    terminated: list[uuid.UUID]
    """Runs the engine finished without calling back: each must end once."""
    stopped: list[tuple[uuid.UUID, str | None]]
    """Breached runs still going: each must be stopped once and end once."""
    flagged: uuid.UUID
    quiet: list[uuid.UUID]


async def scenario(tagged: Tagged, store: Store, *, quiet: int = 3) -> Scenario:
    """Executions for every kind of action, started through an untagged adapter."""
    external = external_config(tagged.url)
    rig = Rig(tagged.fake, tagged.url, store, external, N8nEngine(external.engines["n8n"]))
    try:
        finished = [await rig.start(Script(outcome="success", callback="lose"), SLOW)
                    for _ in range(3)]
        breached = [await rig.start(Script.forever(callback="lose"), FAST) for _ in range(2)]
        flagged = await rig.delegate_only(SLOW)
        quiet_ids = [(await rig.start(Script.forever(callback="lose"), SLOW)).id
                     for _ in range(quiet)]
        for s in finished:
            await wait_status(rig, s.run_id, "success")
    finally:
        await rig.engine.aclose()
    await asyncio.sleep(FAST_LIMIT + 0.2)
    return Scenario(rig, [s.id for s in finished], [(s.id, s.run_id) for s in breached],
                    flagged, quiet_ids)


async def assert_acted_on_once(sc: Scenario) -> None:
    rig = sc.rig
    for eid in [*sc.terminated, *(e for e, _ in sc.stopped)]:
        assert (await rig.get(eid)).status == Status.FAILED_TRANSIENT
        assert [ev.kind for ev in await rig.terminal_events(eid)] == ["failed_transient"]
    for _, run_id in sc.stopped:
        outcomes = [r.outcome for r in rig.truth(run_id).stop_requests]
        assert outcomes == ["stopped"], f"run {run_id} stop requests: {outcomes}"
    assert (await rig.kinds(sc.flagged)).count("flagged") == 1
    for eid in sc.quiet:
        e = await rig.get(eid)
        assert e.status == Status.RUNNING and e.flagged_at is None
    await rig.assert_truthful()


def assert_no_overlap(spans: list[Span]) -> None:
    by_tag: dict[str, list[Span]] = {}
    for span in spans:
        by_tag.setdefault(span.tag, []).append(span)
    tags = sorted(by_tag)
    for i, a_tag in enumerate(tags):
        for b_tag in tags[i + 1:]:
            for a in by_tag[a_tag]:
                for b in by_tag[b_tag]:
                    assert a.end <= b.start or b.end <= a.start, (
                        f"{a_tag} {a.method} {a.path} [{a.start:.3f}, {a.end:.3f}] overlaps "
                        f"{b_tag} {b.method} {b.path} [{b.start:.3f}, {b.end:.3f}]")


def services(tagged: Tagged, stores: list[Store]) -> tuple[
        list[ReconcilerService], list[CollectorRegistry], list[N8nEngine]]:
    svcs, registries, engines = [], [], []
    for i, store in enumerate(stores):
        external = external_config(f"{tagged.url}/s{i}")
        engine = N8nEngine(external.engines["n8n"])
        registry = CollectorRegistry()
        svcs.append(ReconcilerService(store, {"n8n": engine}, external.limits,
                                      metrics=ReconcilerMetrics(registry)))
        registries.append(registry)
        engines.append(engine)
    return svcs, registries, engines


def ticks(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("veracity_reconciler_ticks_total",
                                     {"outcome": outcome}) or 0.0


async def test_two_reconcilers_at_once_one_runs_the_other_skips(
    tagged: Tagged, stores: list[Store]
) -> None:
    sc = await scenario(tagged, stores[0])
    tagged.fake.latency = 0.5
    svcs, registries, engines = services(tagged, stores)
    try:
        results = await asyncio.gather(*(s.run_once() for s in svcs))
    finally:
        for engine in engines:
            await engine.aclose()

    assert sorted(r.ran for r in results) == [False, True]
    runner = 0 if results[0].ran else 1
    skipper = 1 - runner
    assert ticks(registries[runner], "ran") == 1
    assert ticks(registries[runner], "skipped_lock") == 0
    assert ticks(registries[skipper], "skipped_lock") == 1
    assert ticks(registries[skipper], "ran") == 0
    assert results[skipper].examined == 0 and results[skipper].actions == []
    assert results[runner].examined == 3 + 2 + 1 + 3
    assert {t.tag for t in tagged.recorder.spans} == {f"s{runner}"}
    await assert_acted_on_once(sc)


async def test_two_reconciler_loops_never_overlap_nor_act_twice(
    tagged: Tagged, stores: list[Store]
) -> None:
    sc = await scenario(tagged, stores[0])
    tagged.fake.latency = 0.3
    svcs, registries, engines = services(tagged, stores)
    stop = asyncio.Event()
    loops = [asyncio.create_task(run_forever(s, 0.05, stop)) for s in svcs]
    try:
        await eventually(
            lambda: all(ticks(r, "ran") >= 1 and ticks(r, "skipped_lock") >= 1
                        for r in registries),
            timeout=10, what="both loops having run and skipped")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*loops), 10)
        for engine in engines:
            await engine.aclose()
    assert {t.tag for t in tagged.recorder.spans} == {"s0", "s1"}
    assert_no_overlap(tagged.recorder.spans)
    assert all(ticks(r, "error") == 0 for r in registries)
    await assert_acted_on_once(sc)


async def advisory_holders(url: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
        return [int(row[0]) for row in await cur.fetchall()]


async def test_lock_connection_killed_mid_tick_leaves_no_stuck_lock(
    tagged: Tagged, stores: list[Store], pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    sc = await scenario(tagged, stores[0], quiet=1)
    tagged.fake.latency = 0.4
    svcs, _, engines = services(tagged, stores)
    try:
        with caplog.at_level(logging.WARNING, logger="veracity.store"):
            tick = asyncio.create_task(svcs[0].run_once())
            holders = await eventually(lambda: advisory_holders(pg_url), timeout=5,
                                       what="the tick holding its advisory lock")
            assert len(holders) == 1
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute("SELECT pg_terminate_backend(%s, 10000)", (holders[0],))
            result = await asyncio.wait_for(tick, 20)
        assert result.ran
        assert any("could not release" in r.getMessage() for r in caplog.records), (
            [r.getMessage() for r in caplog.records])
        assert await advisory_holders(pg_url) == [], "no advisory lock may be left behind"

        # a new tick runs, from another instance and from the same one
        tagged.fake.latency = 0.0
        again = await svcs[1].run_once()
        assert again.ran
        assert (await svcs[0].run_once()).ran
        assert await advisory_holders(pg_url) == []
    finally:
        for engine in engines:
            await engine.aclose()
    await assert_acted_on_once(sc)


async def test_a_tick_that_lost_its_lock_stops_acting(
    tagged: Tagged, stores: list[Store], pg_url: str
) -> None:
    """Ticks never overlap (docs/states.md, guarantee 6), even when the lock's session dies
    mid-tick: from then on another runner may take the lock, so the tick that lost it must not
    go on asking the engine to stop runs or writing its actions. (What it already sent cannot
    be unsent.)

    Each stop is preceded by a check of the lock (the tick's ``before_stop`` hook, watched
    here). A check begun after the lock's session is gone must fail, and stop that run's
    stop. A check answered just before the kill lets its stop go on; on a busy machine the
    stop's requests may even start after the kill is known here, so the tick's requests
    after the kill are allowed for at most as many runs as checks that began before it. The
    look that first reads a run's state is a read, not an act, and may come after the kill."""
    sc = await scenario(tagged, stores[0], quiet=1)
    tagged.fake.latency = 0.4
    svcs, _, engines = services(tagged, stores)
    checks: list[tuple[float, bool]] = []  # (began, passed) of each check before a stop
    unwatched = svcs[0]._stopping

    async def watched() -> None:
        began = time.monotonic()
        try:
            await unwatched()
        except BaseException:
            checks.append((began, False))
            raise
        checks.append((began, True))

    svcs[0]._stopping = watched  # type: ignore[method-assign]
    try:
        tick = asyncio.create_task(svcs[0].run_once())
        holders = await eventually(lambda: advisory_holders(pg_url), timeout=5,
                                   what="the tick holding its advisory lock")

        def terminate() -> float:
            # from a thread: the moment the session is gone is read as it is known, not
            # when this test's coroutine next runs
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s, 10000)", (holders[0],))
                return time.monotonic()

        killed_at = await asyncio.to_thread(terminate)
        second = await svcs[1].run_once()  # the lock is free: another runner takes it
        await asyncio.wait_for(tick, 20)
    finally:
        for engine in engines:
            await engine.aclose()
    assert second.ran
    assert [began for began, passed in checks if passed and began > killed_at] == [], (
        "a lock check begun after the lock was lost let a stop go on", checks, killed_at)
    mine = sorted((t for t in tagged.recorder.spans if t.tag == "s0"), key=lambda t: t.start)
    # A run's first request is the look that reads its state: a read, which changes nothing
    # and may start after the kill when the machine is slow to begin the tick's looks. Every
    # later request about the run (the stop, its log-in, the look after it) is acting.
    looked: set[str] = set()
    acting = []
    for t in mine:
        run = t.path.split("/executions/")[1].split("/")[0] if "/executions/" in t.path else ""
        if run and run not in looked and t.method == "GET":
            looked.add(run)
        elif t.start > killed_at:
            acting.append((run, t))
    late_runs = {run for run, _ in acting if run}
    begun_before = sum(1 for began, _ in checks if began <= killed_at)
    assert len(late_runs) <= begun_before and all(
        run or t.path == "/rest/login" for run, t in acting), (
        "the tick that lost its lock went on acting on the engine beyond the stops its "
        f"checks before the kill let through: {[f'{t.method} {t.path}' for _, t in acting]}; "
        f"checks (began, passed): {checks}; killed at {killed_at}")
    await assert_acted_on_once(sc)


@pytest.mark.slow
async def test_two_server_processes_never_tick_at_the_same_time(
    tagged: Tagged, stores: list[Store], pg_url: str, tmp_path: Path
) -> None:
    sc = await scenario(tagged, stores[0])
    tagged.fake.latency = 0.3

    def config(index: int, port: int) -> str:
        # a short engine timeout: the execution without an external id is flagged once its
        # trigger cannot still be in flight (timeout + 1 s after it was sent)
        return config_toml(f"{tagged.url}/s{index}", f"http://127.0.0.1:{port}", timeout=1.0)

    with server_processes(tmp_path, pg_url, 2, config_for=config,
                          env={"VERACITY_RECONCILER_INTERVAL": "0.1"},
                          args=("--no-worker",)) as servers:
        for server in servers:
            await server.wait_healthy()

        async def both_ran_and_skipped() -> bool:
            for server in servers:
                text = await server.metrics()
                ran = metric_value(text, "veracity_reconciler_ticks_total", outcome="ran")
                skipped = metric_value(text, "veracity_reconciler_ticks_total",
                                       outcome="skipped_lock")
                if not ran or not skipped:
                    return False
            return (await sc.rig.get(sc.flagged)).flagged_at is not None

        await eventually(both_ran_and_skipped, timeout=15, interval=0.2,
                         what="each server having run and skipped a tick, and row four flagged")
        for server in servers:
            text = await server.metrics()
            assert metric_value(text, "veracity_reconciler_ticks_total", outcome="error") == 0
    for server in servers:
        lines = [r for r in server.log_lines() if r.get("domain") == "reconciler"]
        assert any("skipped" in r["message"] for r in lines), server.stderr()
        assert not any(r.get("level") == "error" for r in server.log_lines()), server.stderr()
    assert {t.tag for t in tagged.recorder.spans} == {"s0", "s1"}
    assert_no_overlap(tagged.recorder.spans)
    await assert_acted_on_once(sc)
