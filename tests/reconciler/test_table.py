"""The reconciler's decision table (docs/external.md), row by row, end to end: runs started
the way the worker starts them (claim, then ``worker.trigger.trigger`` through the n8n
adapter) on a fake n8n served over loopback, reconciled by ``ReconcilerService.run_once``;
the fake's ground truth checks the truthfulness guarantee after every scenario.

| ext id | breached | engine   | action                                                    |
| yes    | no       | finished | failed_transient, no remote stop                          |
| yes    | yes      | running  | remote stop; terminal once the engine confirms it          |
| yes    | yes      | finished | failed_transient                                          |
| no     | any      | unknown  | left running, flagged for an operator                     |
and the implicit rows: (id, no breach, running) and (engine answer unknown): nothing.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.reconciler._support import (
    FAST,
    FAST_LIMIT,
    SLOW,
    V1,
    V2,
    VERACITY,
    Rig,
    process_env,
    wait_status,
)
from veracity.core.states import Status
from veracity.testing.fake_n8n import FakeN8n, Script, Work

pytestmark = pytest.mark.timeout(60)

BREACH_WAIT = FAST_LIMIT + 0.25
"""Long enough after a trigger for the FAST workflow's limit to be breached."""


def finishing(outcome: str) -> Script:
    """A run that ends by itself almost at once and never calls back."""
    return Script(steps=(Work(0.05),), outcome=outcome, callback="lose")  # type: ignore[arg-type]


ENGINE_STATUS = {"success": "success", "error": "error", "crash": "crashed"}


# -- row 1: id, no breach, engine finished --------------------------------------------------


@pytest.mark.parametrize("outcome", ["success", "error", "crash"])
async def test_row1_finished_without_callback_ends_failed_transient_without_stop(
    rig: Rig, outcome: str
) -> None:
    s = await rig.start(finishing(outcome), SLOW)
    assert s.outcome.startswith("started"), s.outcome
    await wait_status(rig, s.run_id, ENGINE_STATUS[outcome])

    result = await rig.tick()

    assert result.ran and result.examined == 1
    assert result.stops_requested == 0
    assert [(a.execution_id, a.kind) for a in result.actions] == [(s.id, "terminate")]
    e = await rig.get(s.id)
    # never completed, even when n8n says success: only /complete carries the result
    assert e.status == Status.FAILED_TRANSIENT
    assert e.result is None
    assert isinstance(e.error, dict) and e.error["code"] == "reconciler"
    assert e.error["engine_status"] == ENGINE_STATUS[outcome]
    assert e.error["limit_breached"] is False
    assert rig.truth(s.run_id).stop_requests == (), "no remote stop for a finished run"
    terminal = await rig.terminal_events(s.id)
    assert [ev.kind for ev in terminal] == ["failed_transient"]
    assert isinstance(terminal[0].data, dict) and terminal[0].data["by"] == "reconciler"
    assert rig.sample("veracity_reconciler_actions_total", kind="terminate") == 1
    # terminal is final: the next tick does not even look at it
    again = await rig.tick()
    assert again.ran and again.examined == 0 and again.actions == []
    await rig.assert_truthful()


# -- row 2: id, breached, engine still running ------------------------------------------------


@pytest.mark.parametrize("fake", [V1, V2], indirect=True)
async def test_row2_breached_running_is_stopped_and_terminal_in_the_same_tick(
    rig: Rig, fake: FakeN8n
) -> None:
    s = await rig.start(Script.forever(callback="lose"), FAST)
    within = await rig.tick()  # just triggered: within its limit, nothing to do
    assert within.examined == 1 and within.actions == [] and within.stops_requested == 0
    await asyncio.sleep(BREACH_WAIT)

    result = await rig.tick()

    assert result.stops_requested == 1
    truth = rig.truth(s.run_id)
    assert [r.outcome for r in truth.stop_requests] == ["stopped"]
    # n8n 1.x has no public stop: the adapter falls back to the session stop
    assert truth.stop_requests[0].via == ("rest" if fake.version == V1 else "public")
    assert truth.status == "canceled" and not truth.going
    e = await rig.get(s.id)
    assert e.status == Status.FAILED_TRANSIENT and e.result is None
    terminal = await rig.terminal_events(s.id)
    assert len(terminal) == 1
    data = terminal[0].data
    assert isinstance(data, dict)
    assert data["by"] == "reconciler" and data["limit_breached"] is True
    assert data["stop"] == "ok" and data["engine_status"] == "canceled"
    await rig.assert_truthful()


async def test_row2_a_stop_the_engine_does_not_honour_leaves_it_running_until_it_does(
    rig: Rig,
) -> None:
    # the engine answers OK to the first stop but keeps running (a stop accepted is not a
    # run finished): terminal only at the tick where the engine really says it finished
    s = await rig.start(Script.forever(callback="lose", ignore_stops=2), FAST)
    await asyncio.sleep(BREACH_WAIT)

    for expected in (["ignored"], ["ignored", "ignored"]):
        result = await rig.tick()
        assert result.stops_requested == 1 and result.actions == []
        truth = rig.truth(s.run_id)
        assert [r.outcome for r in truth.stop_requests] == expected
        assert truth.going and truth.status == "running"
        e = await rig.get(s.id)
        assert e.status == Status.RUNNING and e.flagged_at is None
        await rig.assert_truthful()

    result = await rig.tick()
    assert [a.kind for a in result.actions] == ["terminate"]
    assert [r.outcome for r in rig.truth(s.run_id).stop_requests] == [
        "ignored", "ignored", "stopped"]
    assert (await rig.get(s.id)).status == Status.FAILED_TRANSIENT
    assert len(await rig.terminal_events(s.id)) == 1
    await rig.assert_truthful()


# -- row 3: id, breached, engine finished -----------------------------------------------------


@pytest.mark.parametrize("outcome", ["success", "error"])
async def test_row3_breached_and_finished_ends_failed_transient_without_stop(
    rig: Rig, outcome: str
) -> None:
    s = await rig.start(finishing(outcome), FAST)
    await wait_status(rig, s.run_id, ENGINE_STATUS[outcome])
    await asyncio.sleep(BREACH_WAIT)

    result = await rig.tick()

    assert result.stops_requested == 0
    assert [a.kind for a in result.actions] == ["terminate"]
    e = await rig.get(s.id)
    assert e.status == Status.FAILED_TRANSIENT and e.result is None
    assert isinstance(e.error, dict) and e.error["limit_breached"] is True
    assert rig.truth(s.run_id).stop_requests == ()
    await rig.assert_truthful()


# -- row 4: no external id ----------------------------------------------------------------------


async def test_row4_without_external_id_left_running_and_flagged(
    rig: Rig, client: httpx.AsyncClient, database_url: str, tmp_path: object
) -> None:
    # crashed between "trigger being sent" and the engine's answer: no id, whatever the
    # limit says the engine can be neither asked nor stopped
    within = await rig.delegate_only(SLOW)
    breached = await rig.delegate_only(FAST)
    await asyncio.sleep(BREACH_WAIT)

    first = await rig.tick()
    second = await rig.tick()

    assert first.examined == 2 and second.examined == 2
    assert sorted(a.kind for a in first.actions) == ["flag", "flag"]
    assert second.actions == [], "an unchanged flag is not written again"
    assert first.stops_requested == 0 and first.engine_errors == 0
    assert rig.fake.truths() == [], "the engine was neither asked to start nor to stop"
    for eid in (within, breached):
        e = await rig.get(eid)
        assert e.status == Status.RUNNING
        assert e.external_execution_id is None
        assert e.flagged_at is not None
        assert e.flag_reason and "no external id" in e.flag_reason
        assert (await rig.kinds(eid)).count("flagged") == 1
    assert rig.sample("veracity_reconciler_actions_total", kind="flag") == 2

    # operators find them: GET ?flagged=true ...
    response = await client.get("/v1/executions", params={"flagged": "true"})
    assert response.status_code == 200, response.text
    listed = {item["id"]: item for item in response.json()["items"]}
    assert set(listed) == {str(within), str(breached)}
    for item in listed.values():
        assert item["status"] == "running" and item["flagged_at"] and item["flag_reason"]
    unflagged = await client.get("/v1/executions", params={"flagged": "false"})
    assert {i["id"] for i in unflagged.json()["items"]}.isdisjoint(listed)

    # ... and `veracity list --flagged`
    env = process_env(database_url)
    proc = await asyncio.create_subprocess_exec(
        VERACITY, "list", "--flagged", "--json", env=env, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    items = json.loads(out)["items"]
    assert {i["id"] for i in items} == {str(within), str(breached)}
    assert all(i["flag_reason"] for i in items)
    proc = await asyncio.create_subprocess_exec(
        VERACITY, "list", "--flagged", env=env, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert str(within) in text and str(breached) in text
    assert text.count("flagged:") == 2, text
    await rig.assert_truthful()


async def test_row4_waits_while_the_trigger_may_still_be_in_flight(rig: Rig) -> None:
    """No external id yet is not news while the worker may still be waiting for the
    engine's answer (the engine's call timeout, which the server passes as the grace): a
    tick then neither flags nor acts; once the grace is over, row four applies."""
    eid = await rig.delegate_only(SLOW)

    during = await rig.tick(trigger_grace={"n8n": 60.0})
    assert during.examined == 1 and during.actions == []
    e = await rig.get(eid)
    assert (e.status, e.flagged_at) == (Status.RUNNING, None)
    assert "flagged" not in await rig.kinds(eid)
    # another engine's grace does not apply to this one
    other = await rig.tick(trigger_grace={"elsewhere": 60.0})
    assert [a.kind for a in other.actions] == ["flag"]
    assert (await rig.get(eid)).flagged_at is not None


# -- implicit rows -------------------------------------------------------------------------------


async def test_implicit_id_within_limit_engine_running_nothing_to_do(rig: Rig) -> None:
    s = await rig.start(Script.forever(callback="lose"), SLOW)
    for _ in range(2):
        result = await rig.tick()
        assert result.examined == 1 and result.actions == [] and result.stops_requested == 0
    e = await rig.get(s.id)
    assert e.status == Status.RUNNING and e.flagged_at is None
    assert rig.truth(s.run_id).stop_requests == ()
    assert await rig.kinds(s.id) == ["pending", "running", "trigger_sending", "external_started"]
    await rig.assert_truthful()


@pytest.mark.parametrize("ffqn", [SLOW, FAST])
async def test_implicit_engine_answer_unknown_nothing_to_do(rig: Rig, ffqn: str) -> None:
    # even breached: an unknown answer never stops nor ends it
    s = await rig.start(Script.forever(callback="lose", get_error=503), ffqn)
    await asyncio.sleep(BREACH_WAIT)
    result = await rig.tick()
    assert result.examined == 1 and result.actions == [] and result.stops_requested == 0
    assert result.engine_errors == 1
    e = await rig.get(s.id)
    assert e.status == Status.RUNNING and e.flagged_at is None
    assert rig.truth(s.run_id).stop_requests == ()
    await rig.assert_truthful()


async def test_every_row_at_once_in_one_tick(rig: Rig) -> None:
    """All the rows side by side in one tick: each gets its own action, and nothing else."""
    finished = await rig.start(finishing("success"), SLOW)
    breached_running = await rig.start(Script.forever(callback="lose"), FAST)
    breached_finished = await rig.start(finishing("error"), FAST)
    no_id = await rig.delegate_only(FAST)
    quiet = await rig.start(Script.forever(callback="lose"), SLOW)
    unknown = await rig.start(Script.forever(callback="lose", get_error=500), FAST)
    await wait_status(rig, finished.run_id, "success")
    await wait_status(rig, breached_finished.run_id, "error")
    await asyncio.sleep(BREACH_WAIT)

    result = await rig.tick()

    assert result.examined == 6
    acted = {a.execution_id: a.kind for a in result.actions}
    assert acted == {finished.id: "terminate", breached_running.id: "terminate",
                     breached_finished.id: "terminate", no_id: "flag"}
    assert result.stops_requested == 1
    statuses = {eid: (await rig.get(eid)).status for eid in (
        finished.id, breached_running.id, breached_finished.id, no_id, quiet.id, unknown.id)}
    assert statuses == {
        finished.id: Status.FAILED_TRANSIENT, breached_running.id: Status.FAILED_TRANSIENT,
        breached_finished.id: Status.FAILED_TRANSIENT, no_id: Status.RUNNING,
        quiet.id: Status.RUNNING, unknown.id: Status.RUNNING}
    stopped = {t.execution_id for t in rig.fake.truths() if t.stop_requests}
    assert stopped == {str(breached_running.id)}
    await rig.assert_truthful()

