"""The reconciler's tick in process (veracity.maintenance.reconciler): its pages, its bound
on engine calls, its lock, its metrics and its log lines (docs/external.md, "The
reconciler"), over a real store and an engine scripted by run id. The end-to-end behaviour
over the fake n8n and server processes is in tests/reconciler/."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.maintenance.conftest import StoreFactory
from tests.store._support import get
from tests.store.test_external import attached, delegated
from veracity.adapters.base import CallbackInfo, Inspection, StartResult, StopResult
from veracity.clock import ManualClock
from veracity.config import Settings
from veracity.core.reconcile import EngineState
from veracity.core.states import Status
from veracity.maintenance.reconciler import (
    ACTION_KINDS,
    ReconcilerMetrics,
    ReconcilerService,
    TickResult,
)
from veracity.store import RunnerLock, Store

RUNNING = Inspection(EngineState.RUNNING, status="running")
FINISHED = Inspection(EngineState.FINISHED, status="success", stopped_at="2030-01-01T00:00:00Z")


@dataclass
class Engine:
    """Answers by run id (``RUNNING`` for a run it was told nothing about; an exception is
    raised; each answer after a stop is ``after_stop``); counts the calls in flight."""

    answers: dict[str, Inspection | BaseException] = field(default_factory=dict)
    after_stop: Inspection = RUNNING
    latency: float = 0.0
    stopped: list[str] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    name: str = "n8n"

    async def start(self, execution_id: str, params: Any, callback: CallbackInfo, *,
                    target: str) -> StartResult:
        raise AssertionError("the reconciler never starts a run")

    async def inspect(self, external_id: str) -> Inspection:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        if external_id in self.stopped:
            return self.after_stop
        answer = self.answers.get(external_id, RUNNING)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def stop(self, external_id: str) -> StopResult:
        self.stopped.append(external_id)
        return StopResult(ok=True)

    async def aclose(self) -> None:
        pass


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ReconcilerMetrics(self.registry)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(f"veracity_reconciler_{name}", labels)


def service(store: Store, engine: Engine, m: Metrics, *, limit: float | None = None,
            ffqns: tuple[str, ...] = (), **options: Any) -> ReconcilerService:
    return ReconcilerService(store, {"n8n": engine}, dict.fromkeys(ffqns, limit),
                             metrics=m.metrics, **options)


def test_every_series_is_exported_at_zero_from_the_start() -> None:
    """Every tick outcome and action kind has its series before it first happens (an alert
    on ``outcome="error"`` has a series to read)."""
    m = Metrics()
    for outcome in ("ran", "skipped_lock", "error"):
        assert m.sample("ticks_total", outcome=outcome) == 0.0, outcome
    assert ACTION_KINDS == ("terminate", "flag", "unflag", "stop")
    for kind in ACTION_KINDS:
        assert m.sample("actions_total", kind=kind) == 0.0, kind


async def test_tick_durations_are_counted_in_the_documented_buckets() -> None:
    """docs/external.md lists the buckets of ``veracity_reconciler_tick_duration_seconds``
    (a dashboard's quantiles are read from them)."""
    m = Metrics()
    bounds = [s.labels["le"] for metric in m.registry.collect()
              if metric.name == "veracity_reconciler_tick_duration_seconds"
              for s in metric.samples if s.name.endswith("_bucket")]
    assert bounds == ["0.01", "0.05", "0.1", "0.5", "1.0", "2.0", "5.0", "10.0", "30.0",
                      "60.0", "120.0", "+Inf"]


async def test_the_defaults_are_the_configurations(store: Store) -> None:
    defaults = Settings().reconciler
    s = ReconcilerService(store, {}, {})
    assert s.concurrency == defaults.concurrency == 16
    assert s.looker.engine_timeout == defaults.engine_timeout
    assert s.looker.stop_flag_after == defaults.stop_flag_after


async def test_a_tick_reads_every_page_and_applies_what_the_looks_decided(
    store: Store
) -> None:
    runs = [f"run-{i}" for i in range(5)]
    ids = [await attached(store, run) for run in runs]
    no_id = await delegated(store)
    engine = Engine({runs[1]: FINISHED, runs[4]: FINISHED})
    m = Metrics()

    before = time.monotonic()
    result = await service(store, engine, m, page_size=2).run_once()
    took = time.monotonic() - before

    assert (result.ran, result.examined, result.lock_lost) == (True, 6, False)
    assert sorted((str(a.kind), a.execution_id) for a in result.actions) == sorted(
        [("terminate", ids[1]), ("terminate", ids[4]), ("flag", no_id)])
    for i, eid in enumerate(ids):
        status = (await get(store, eid)).status
        assert status is (Status.FAILED_TRANSIENT if i in (1, 4) else Status.RUNNING), i
    assert m.sample("executions_examined_total") == 6
    assert m.sample("actions_total", kind="terminate") == 2
    assert m.sample("actions_total", kind="flag") == 1
    assert m.sample("ticks_total", outcome="ran") == 1
    assert m.sample("tick_duration_seconds_count") == 1
    recorded = m.sample("tick_duration_seconds_sum")
    assert recorded is not None and 0 < recorded <= took  # the tick's own duration
    # a full last page is followed by an empty one, which ends the tick
    assert (await service(store, Engine(), Metrics(), page_size=3).run_once()).examined == 4


async def test_engine_calls_are_bounded_by_the_concurrency(store: Store) -> None:
    for i in range(6):
        await attached(store, f"run-{i}")
    engine = Engine(latency=0.05)
    await service(store, engine, Metrics(), concurrency=2).run_once()
    assert engine.most_in_flight == 2
    engine = Engine(latency=0.05)
    await service(store, engine, Metrics(), concurrency=6).run_once()
    assert engine.most_in_flight == 6


async def test_unusable_answers_are_counted_by_kind(store: Store) -> None:
    await attached(store, "run-1")
    await attached(store, "run-2")
    m = Metrics()
    result = await service(store, Engine({"run-1": RuntimeError("boom"),
                                          "run-2": RuntimeError("boom")}), m).run_once()
    assert result.engine_errors == 2
    assert m.sample("engine_errors_total", kind="adapter_error") == 2
    assert result.actions == []


async def test_a_busy_lock_skips_the_tick(store: Store, other_store: StoreFactory) -> None:
    await attached(store, "run-1")
    engine = Engine({"run-1": FINISHED})
    m = Metrics()
    other = await other_store()
    async with other.single_runner("reconciler") as held:
        assert held
        result = await service(store, engine, m).run_once()
    assert result == TickResult(ran=False)
    assert m.sample("ticks_total", outcome="skipped_lock") == 1
    assert m.sample("ticks_total", outcome="ran") == 0
    assert m.sample("tick_duration_seconds_count") == 0  # only ticks that ran are timed


class Failing:
    """The store, except that reading the delegated runs raises."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def execution_external_running(self, **_: Any) -> Any:
        raise RuntimeError("the database went away")


async def test_a_tick_that_fails_counts_an_error_and_raises(store: Store) -> None:
    m = Metrics()
    failing = service(Failing(store), Engine(), m)
    with pytest.raises(RuntimeError, match="went away"):
        await failing.run_once()
    assert m.sample("ticks_total", outcome="error") == 1
    assert m.sample("ticks_total", outcome="ran") == 0
    assert m.sample("tick_duration_seconds_count") == 1  # it did run


class LosesItsLock:
    """The store, except that the single-runner lock is taken and then lost at once."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @asynccontextmanager
    async def single_runner(self, name: str) -> AsyncIterator[RunnerLock]:
        async def held() -> bool:
            return False

        yield RunnerLock(True, held)


async def test_a_tick_that_lost_its_lock_neither_stops_nor_writes(
    store: Store, clock: ManualClock
) -> None:
    finished = await attached(store, "run-1")
    breached = await attached(store, "run-2")
    ffqn = (await get(store, breached)).ffqn
    clock.advance(timedelta(seconds=120))
    engine = Engine({"run-1": FINISHED})
    m = Metrics()

    result = await service(LosesItsLock(store), engine, m,
                           limit=60.0, ffqns=(ffqn,)).run_once()

    assert result == TickResult(ran=True, lock_lost=True)
    assert engine.stopped == []
    assert m.sample("actions_total", kind="stop") == 0
    assert (await get(store, finished)).status is Status.RUNNING
    assert m.sample("ticks_total", outcome="error") == 1
    assert m.sample("ticks_total", outcome="ran") == 0


@pytest.mark.parametrize(("after_stop", "words"), [
    (FINISHED, "the engine confirms the run finished"),
    (RUNNING, "the engine has not stopped the run yet"),
])
async def test_a_stop_is_counted_and_logged_with_what_the_engine_then_said(
    store: Store, clock: ManualClock, caplog: pytest.LogCaptureFixture, after_stop: Inspection,
    words: str
) -> None:
    eid = await attached(store, "run-1")
    ffqn = (await get(store, eid)).ffqn
    clock.advance(timedelta(seconds=120))
    engine = Engine(after_stop=after_stop)
    m = Metrics()

    with caplog.at_level(logging.INFO, logger="veracity.reconciler"):
        result = await service(store, engine, m, limit=60.0, ffqns=(ffqn,)).run_once()

    assert engine.stopped == ["run-1"] and result.stops_requested == 1
    assert m.sample("actions_total", kind="stop") == 1
    (line,) = [r for r in caplog.records if getattr(r, "action", None) == "stop"]
    assert line.getMessage() == (
        f"stop: limit breached; asked the engine to stop run run-1 (ok); {words}")
    finished = after_stop is FINISHED
    assert (line.execution_id, line.external_execution_id, line.engine) == (  # type: ignore[attr-defined]
        str(eid), "run-1", "n8n")
    assert (line.stop, line.engine_finished, line.cause) == (  # type: ignore[attr-defined]
        "ok", finished, "limit")
    assert line.engine_status == after_stop.status  # type: ignore[attr-defined]
    ended = [r for r in caplog.records if getattr(r, "action", None) == "terminate"]
    assert len(ended) == int(finished)
    if finished:
        assert ended[0].status == "failed_transient"  # type: ignore[attr-defined]
        assert ended[0].detail_stop == "ok"  # type: ignore[attr-defined]


async def test_every_write_is_logged_with_its_execution_and_kind(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    eid = await delegated(store)
    with caplog.at_level(logging.INFO, logger="veracity.reconciler"):
        await service(store, Engine(), Metrics()).run_once()
    (line,) = [r for r in caplog.records if getattr(r, "action", None) == "flag"]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith("flag: no external id")
    assert (line.execution_id, line.external_execution_id) == (  # type: ignore[attr-defined]
        str(eid), None)
    assert line.flag_kind == "no_external_id"  # type: ignore[attr-defined]
    assert line.domain == "reconciler"  # type: ignore[attr-defined]
    assert not hasattr(line, "status")
