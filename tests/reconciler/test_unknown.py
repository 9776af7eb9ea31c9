"""Engine answers the reconciler cannot trust: 5xx, timeouts, bodies that are not JSON or lack
fields, unknown or self-contradicting statuses, 404 and 400 for the id, an unreachable engine,
an adapter that raises. Each is "unknown": the execution stays running (404 and 400 also
flag it), the error is counted by kind, and the loop goes on. Also stops that fail."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.reconciler._support import (
    CLOSED_URL,
    ENV,
    FAST,
    FAST_LIMIT,
    SLOW,
    Rig,
    engine_table,
    external_config,
    wait_status,
)
from veracity.adapters.base import CallbackInfo, Engine, Inspection, StartResult, StopResult
from veracity.adapters.config import parse_engine_config
from veracity.adapters.n8n import N8nEngine
from veracity.core.requests import ResolveAction
from veracity.core.states import Status
from veracity.maintenance._loop import run_forever
from veracity.maintenance.reconciler import ReconcilerService
from veracity.testing.fake_n8n import Script

pytestmark = pytest.mark.timeout(60)

BREACH_WAIT = FAST_LIMIT + 0.25
STOPPED_AT = "2030-01-01T00:00:00.000Z"

BAD_ANSWERS: list[tuple[str, dict[str, Any]]] = [
    ("server_error", {"get_error": 500}),
    ("server_error", {"get_error": 503}),
    ("http_error", {"get_error": 418}),
    ("bad_json", {"get_raw_body": "<html>502 Bad Gateway</html>"}),
    ("bad_json", {"get_raw_body": "[1, 2, 3]"}),
    ("bad_json", {"get_raw_body": ""}),
    ("missing_fields", {"get_raw_body": '{"finished": true}'}),
    ("missing_fields", {"get_raw_body": '{"status": 7, "stoppedAt": "' + STOPPED_AT + '"}'}),
    ("missing_fields", {"get_raw_body": '{"status": "success", "stoppedAt": 12}'}),
    ("unknown_status", {"report_status": "unknown"}),
    ("unknown_status", {"report_status": "SUCCESS"}),
    # terminal status without stoppedAt: contradicts itself
    ("inconsistent", {"report_status": "success"}),
    # the answer for another run
    ("inconsistent", {"get_raw_body": '{"id": "999999", "status": "success", "stoppedAt": "'
                      + STOPPED_AT + '"}'}),
]


async def test_bad_answers_are_unknown_left_running_and_counted_by_kind(rig: Rig) -> None:
    # all breached: a trustworthy "running" would mean a stop, "finished" an end; an unknown
    # answer means neither. One tick sees every kind of bad answer at once.
    started = [(kind, await rig.start(Script.forever(callback="lose", **controls), FAST))
               for kind, controls in BAD_ANSWERS]
    await asyncio.sleep(BREACH_WAIT)
    expected: dict[str, float] = {}
    for kind, _ in BAD_ANSWERS:
        expected[kind] = expected.get(kind, 0.0) + 1.0

    for tick in (1, 2):
        result = await rig.tick()
        assert result.ran and result.examined == len(BAD_ANSWERS)
        assert result.actions == [] and result.stops_requested == 0
        assert result.engine_errors == len(BAD_ANSWERS)
        assert rig.all_engine_errors() == {k: v * tick for k, v in expected.items()}
    for kind, s in started:
        e = await rig.get(s.id)
        assert e.status == Status.RUNNING and e.flagged_at is None, kind
        assert rig.truth(s.run_id).stop_requests == (), kind
    assert rig.sample("veracity_reconciler_ticks_total", outcome="ran") == 2
    assert rig.sample("veracity_reconciler_ticks_total", outcome="error") == 0

    # once the engine answers sensibly again, the breached runs are stopped as usual
    for _, s in started:
        rig.fake.control(str(s.run_id), get_error=None, get_raw_body=None, report_status=None)
    result = await rig.tick()
    assert result.stops_requested == len(BAD_ANSWERS)
    for kind, s in started:
        assert (await rig.get(s.id)).status == Status.FAILED_TRANSIENT, kind
    await rig.assert_truthful()


@pytest.mark.parametrize("controls", [{"get_hang": True}, {"get_delay": 2.0}],
                         ids=["hang", "late"])
async def test_engine_timeout_is_unknown(rig: Rig, controls: dict[str, Any]) -> None:
    s = await rig.start(Script.forever(callback="lose", **controls), FAST)
    await asyncio.sleep(BREACH_WAIT)
    started = asyncio.get_running_loop().time()
    result = await rig.tick(engine_timeout=0.3)
    assert asyncio.get_running_loop().time() - started < 1.5, "the per-call timeout bounds it"
    assert result.actions == [] and result.stops_requested == 0 and result.engine_errors == 1
    assert rig.all_engine_errors() == {"timeout": 1.0}
    assert (await rig.get(s.id)).status == Status.RUNNING
    await rig.assert_truthful()


async def test_a_slow_answer_does_not_hold_up_the_others(rig: Rig) -> None:
    slow = await rig.start(Script.forever(callback="lose", get_hang=True), SLOW)
    done = await rig.start(Script(outcome="success", callback="lose"), SLOW)
    await wait_status(rig, done.run_id, "success")
    result = await rig.tick(engine_timeout=0.3)
    assert [(a.execution_id, a.kind) for a in result.actions] == [(done.id, "terminate")]
    assert (await rig.get(slow.id)).status == Status.RUNNING
    await rig.assert_truthful()


@pytest.mark.parametrize("ffqn", [SLOW, FAST])
async def test_404_for_the_id_left_running_and_flagged(rig: Rig, ffqn: str) -> None:
    s = await rig.start(Script.forever(callback="lose"), ffqn)
    rig.fake.forget(str(s.run_id))  # pruned, or never n8n's id
    await asyncio.sleep(BREACH_WAIT)

    first = await rig.tick()
    second = await rig.tick()

    assert [a.kind for a in first.actions] == ["flag"]
    assert second.actions == [], "the same flag is not written twice"
    assert first.stops_requested == 0 and second.stops_requested == 0
    e = await rig.get(s.id)
    assert e.status == Status.RUNNING
    assert e.flagged_at is not None
    assert e.flag_reason is not None and "does not know" in e.flag_reason
    assert str(s.run_id) in e.flag_reason
    assert (await rig.kinds(s.id)).count("flagged") == 1
    assert rig.all_engine_errors() == {"not_found": 2.0}
    await rig.assert_truthful()


async def test_400_for_an_id_the_engine_rejects_is_flagged(rig: Rig) -> None:
    # an operator attached an id n8n can never accept (not a number)
    eid = await rig.delegate_only(SLOW)
    resolved = await rig.store.execution_resolve(
        eid, action=ResolveAction.ATTACH, external_id="abc-1", reason="typo", actor="alice")
    assert resolved.changed
    result = await rig.tick()
    assert [a.kind for a in result.actions] == ["flag"]
    e = await rig.get(eid)
    assert e.status == Status.RUNNING and e.flagged_at is not None
    assert e.flag_reason is not None and "refuses" in e.flag_reason
    assert rig.all_engine_errors() == {"bad_request": 1.0}


async def test_unreachable_engine_is_unknown(rig: Rig) -> None:
    s = await rig.start(Script.forever(callback="lose"), FAST)
    await asyncio.sleep(BREACH_WAIT)
    down = N8nEngine(external_config(CLOSED_URL).engines["n8n"])
    try:
        service = ReconcilerService(rig.store, {"n8n": down}, rig.external.limits,
                                    metrics=rig.metrics)
        result = await service.run_once()
    finally:
        await down.aclose()
    assert result.actions == [] and result.engine_errors == 1
    assert rig.all_engine_errors() == {"unreachable": 1.0}
    assert (await rig.get(s.id)).status == Status.RUNNING


async def test_engine_down_for_a_restart_is_unknown(rig: Rig) -> None:
    s = await rig.start(Script.forever(callback="lose"), FAST)
    await asyncio.sleep(BREACH_WAIT)
    rig.fake.kill()  # answers 503 while down; its running runs really stop now
    result = await rig.tick()
    assert result.actions == [] and result.stops_requested == 0
    assert (await rig.get(s.id)).status == Status.RUNNING
    rig.fake.start()  # back: the killed run reads crashed
    result = await rig.tick()
    assert [a.kind for a in result.actions] == ["terminate"]
    e = await rig.get(s.id)
    assert e.status == Status.FAILED_TRANSIENT
    assert isinstance(e.error, dict) and e.error["engine_status"] == "crashed"
    await rig.assert_truthful()


async def test_unconfigured_engine_is_flagged(rig: Rig) -> None:
    s = await rig.start(Script.forever(callback="lose"), FAST)
    await asyncio.sleep(BREACH_WAIT)
    service = ReconcilerService(rig.store, {}, rig.external.limits, metrics=rig.metrics)
    result = await service.run_once()
    assert [a.kind for a in result.actions] == ["flag"]
    e = await rig.get(s.id)
    assert e.status == Status.RUNNING and e.flag_reason and "not configured" in e.flag_reason
    assert rig.truth(s.run_id).stop_requests == ()


class Sabotaged:
    """The real adapter, except for the ids told to raise, and scripted inspect answers."""

    def __init__(self, inner: Engine, raise_for: set[str] | None = None) -> None:
        self.inner = inner
        self.raise_for = raise_for or set()
        self.fail_inspect_calls: set[int] = set()
        self.inspect_calls = 0

    @property
    def name(self) -> str:
        return self.inner.name

    async def start(self, execution_id: str, params: Any, callback: CallbackInfo, *,
                    target: str) -> StartResult:
        return await self.inner.start(execution_id, params, callback, target=target)

    async def inspect(self, external_id: str) -> Inspection:
        self.inspect_calls += 1
        if external_id in self.raise_for:
            raise RuntimeError("adapter bug")
        if self.inspect_calls in self.fail_inspect_calls:
            raise ConnectionResetError("lost after the stop")
        return await self.inner.inspect(external_id)

    async def stop(self, external_id: str) -> StopResult:
        if external_id in self.raise_for:
            raise RuntimeError("adapter bug")
        return await self.inner.stop(external_id)

    async def aclose(self) -> None:
        pass


async def test_an_adapter_that_raises_does_not_crash_the_tick(rig: Rig) -> None:
    bad = await rig.start(Script.forever(callback="lose"), FAST)
    good = await rig.start(Script(outcome="success", callback="lose"), SLOW)
    await wait_status(rig, good.run_id, "success")
    await asyncio.sleep(BREACH_WAIT)
    engine = Sabotaged(rig.engine, raise_for={str(bad.run_id)})
    service = ReconcilerService(rig.store, {"n8n": engine}, rig.external.limits,
                                metrics=rig.metrics)
    result = await service.run_once()
    assert [(a.execution_id, a.kind) for a in result.actions] == [(good.id, "terminate")]
    assert rig.all_engine_errors() == {"adapter_error": 1.0}
    assert (await rig.get(bad.id)).status == Status.RUNNING
    await rig.assert_truthful()


async def test_after_a_stop_the_decision_comes_from_the_engines_next_answer(rig: Rig) -> None:
    # the stop works, but the inspection after it fails: not terminal this tick (the engine
    # did not confirm); the next tick sees the run finished and ends it without a new stop
    s = await rig.start(Script.forever(callback="lose"), FAST)
    await asyncio.sleep(BREACH_WAIT)
    engine = Sabotaged(rig.engine)
    engine.fail_inspect_calls = {2}
    service = ReconcilerService(rig.store, {"n8n": engine}, rig.external.limits,
                                metrics=rig.metrics)
    first = await service.run_once()
    assert first.stops_requested == 1 and first.actions == []
    assert not rig.truth(s.run_id).going
    assert (await rig.get(s.id)).status == Status.RUNNING
    second = await service.run_once()
    assert second.stops_requested == 0
    assert [a.kind for a in second.actions] == ["terminate"]
    assert len(rig.truth(s.run_id).stop_requests) == 1
    await rig.assert_truthful()


async def test_stop_that_fails_then_succeeds(rig: Rig) -> None:
    s = await rig.start(Script.forever(callback="lose", stop_failures=1), FAST)
    await asyncio.sleep(BREACH_WAIT)

    first = await rig.tick()
    assert first.stops_requested == 1 and first.actions == []
    assert (await rig.get(s.id)).status == Status.RUNNING
    assert rig.engine_errors("stop_failed") == 1
    assert [r.outcome for r in rig.truth(s.run_id).stop_requests] == ["failed"]
    await rig.assert_truthful()

    second = await rig.tick()
    assert second.stops_requested == 1
    assert [a.kind for a in second.actions] == ["terminate"]
    assert [r.outcome for r in rig.truth(s.run_id).stop_requests] == ["failed", "stopped"]
    assert (await rig.get(s.id)).status == Status.FAILED_TRANSIENT
    assert rig.engine_errors("stop_failed") == 1
    await rig.assert_truthful()


async def test_stop_impossible_without_a_session_stays_running(rig: Rig) -> None:
    # n8n 1.x and a wrong password: the session stop cannot log in; never terminal
    s = await rig.start(Script.forever(callback="lose"), FAST)
    await asyncio.sleep(BREACH_WAIT)
    cfg = parse_engine_config("n8n", engine_table(rig.base_url),
                              {**ENV, "N8N_PASSWORD": "wrong"})
    engine = N8nEngine(cfg)
    try:
        service = ReconcilerService(rig.store, {"n8n": engine}, rig.external.limits,
                                    metrics=rig.metrics)
        for _ in range(2):
            result = await service.run_once()
            assert result.stops_requested == 1 and result.actions == []
    finally:
        await engine.aclose()
    assert rig.engine_errors("stop_failed") == 2
    assert rig.truth(s.run_id).going
    assert (await rig.get(s.id)).status == Status.RUNNING
    await rig.assert_truthful()


async def test_the_loop_goes_on_through_bad_answers(rig: Rig) -> None:
    bad = [
        await rig.start(Script.forever(callback="lose", get_error=500), FAST),
        await rig.start(Script.forever(callback="lose", get_raw_body="nope"), FAST),
        await rig.start(Script.forever(callback="lose", report_status="new-thing"), FAST),
    ]
    finished = await rig.start(Script(outcome="error", callback="lose"), SLOW)
    stop = asyncio.Event()
    service = rig.service(engine_timeout=0.5)
    loop = asyncio.create_task(run_forever(service, 0.05, stop))
    try:
        await asyncio.sleep(0.8)
        assert not loop.done(), "the loop must not end by itself"
    finally:
        stop.set()
        await asyncio.wait_for(loop, 5)
    assert rig.sample("veracity_reconciler_ticks_total", outcome="ran") >= 3
    assert rig.sample("veracity_reconciler_ticks_total", outcome="error") == 0
    errors = rig.all_engine_errors()
    assert set(errors) == {"server_error", "bad_json", "unknown_status"}
    assert (await rig.get(finished.id)).status == Status.FAILED_TRANSIENT
    for s in bad:
        assert (await rig.get(s.id)).status == Status.RUNNING
    await rig.assert_truthful()
