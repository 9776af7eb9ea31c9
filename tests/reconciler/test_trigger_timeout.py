"""A trigger that times out after the engine started the run (the table's fourth row): the
execution stays running without an external id, is flagged at once, and is never triggered
again — by the worker, another worker, recovery or the reconciler. An operator resolves it
(PUT /v1/executions/{id}/resolve or ``veracity resolve``): attach the id and the reconciler
takes over, or end it with who and why in history."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import httpx
import pytest

from tests.reconciler._support import (
    DEPLOYMENT,
    FAST,
    FAST_LIMIT,
    SLOW,
    VERACITY,
    Rig,
    callback_token,
    eventually,
    process_env,
)
from tests.reconciler.conftest import MakeRig
from veracity.app import App
from veracity.config import WorkerSettings
from veracity.core.states import Status
from veracity.maintenance.recovery import RecoveryService
from veracity.models import NewExecution
from veracity.testing.fake_n8n import Script
from veracity.worker.runner import Worker

pytestmark = pytest.mark.timeout(60)

WORKER = WorkerSettings(concurrency=4, lease_ttl=2.0, heartbeat_interval=0.2,
                        poll_interval=0.05, shutdown_grace=1.0)


def worker_for(rig: Rig) -> Worker:
    return Worker(rig.store, App(), settings=WORKER, deployment_id=DEPLOYMENT,
                  external=rig.external, engines={"n8n": rig.engine})


async def submit(rig: Rig, ffqn: str, script: Script) -> uuid.UUID:
    eid = uuid.uuid4()
    rig.fake.script_for_execution(str(eid), script)
    await rig.store.execution_submit(NewExecution(ffqn=ffqn, params=[{"n": 1}],
                                                  deployment_id=DEPLOYMENT, id=eid))
    rig.started.append(eid)
    return eid


async def run_worker_until(rig: Rig, done: asyncio.Event | None = None,
                           seconds: float = 0.0) -> Worker:
    worker = worker_for(rig)
    task = asyncio.create_task(worker.run())
    try:
        if done is not None:
            await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(seconds)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    return worker


async def timed_out_trigger(make_rig: MakeRig, ffqn: str, respond: str) -> tuple[Rig, uuid.UUID]:
    """An execution whose trigger the engine took (the run exists) but never answered within
    the adapter's timeout, started by a real in-process worker."""
    rig = await make_rig(timeout=0.4)
    script = (Script.forever(callback="lose", respond="hang") if respond == "hang"
              else Script.forever(callback="lose", respond_delay=3.0))
    eid = await submit(rig, ffqn, script)
    worker = worker_for(rig)
    task = asyncio.create_task(worker.run())
    try:
        async def flagged() -> bool:
            return (await rig.get(eid)).flagged_at is not None

        await eventually(flagged, timeout=10, what="the ambiguous trigger flagged")
        # the worker keeps looping a while: it must not claim or trigger it again
        await asyncio.sleep(0.5)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert worker.claimed_total == 1
    return rig, eid


@pytest.mark.parametrize("respond", ["hang", "late"])
async def test_ambiguous_trigger_is_row_four_flagged_and_never_triggered_again(
    make_rig: MakeRig, respond: str
) -> None:
    rig, eid = await timed_out_trigger(make_rig, SLOW, respond)

    e = await rig.get(eid)
    assert e.status == Status.RUNNING
    assert e.engine == "n8n" and e.external_execution_id is None
    assert e.triggered_at is not None and e.lease_owner is None
    assert e.flagged_at is not None and e.flag_reason
    assert "trigger" in e.flag_reason and "not triggered again" in e.flag_reason.lower()
    runs = rig.fake.runs_for_execution(str(eid))
    assert len(runs) == 1 and runs[0].going, "the engine did start the run"

    # more worker loops (a new worker too), recovery, reconciler ticks: never a second run
    await run_worker_until(rig, seconds=0.4)
    recovery = await RecoveryService(rig.store, max_attempts=5).run_once()
    assert recovery.ran
    await asyncio.sleep(FAST_LIMIT)
    for _ in range(3):
        result = await rig.tick()
        assert result.examined == 1 and result.stops_requested == 0
    assert len(rig.fake.runs_for_execution(str(eid))) == 1
    kinds = await rig.kinds(eid)
    assert kinds.count("running") == 1 and kinds.count("trigger_sending") == 1, kinds
    e = await rig.get(eid)
    assert e.status == Status.RUNNING and e.external_execution_id is None
    assert e.flagged_at is not None
    await rig.assert_truthful()


async def test_a_slow_trigger_is_not_reported_as_a_lost_lease(
    make_rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    """Delegating clears the lease on purpose (the run is the engine's from then on): the
    worker's heartbeats during a slow trigger must not warn that the lease was lost."""
    with caplog.at_level(logging.WARNING, logger="veracity.worker"):
        await timed_out_trigger(make_rig, SLOW, "hang")
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == [], lost


async def test_refused_trigger_fails_with_the_engines_message(make_rig: MakeRig) -> None:
    rig = await make_rig()
    eid = await submit(rig, SLOW, Script(respond="refuse", refuse_status=403,
                                         refuse_body={"message": "Authorization data is wrong!"}))
    worker = worker_for(rig)
    task = asyncio.create_task(worker.run())
    try:
        async def ended() -> bool:
            return (await rig.get(eid)).status.is_terminal

        await eventually(ended, timeout=10, what="the refusal recorded")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    e = await rig.get(eid)
    assert e.status == Status.FAILED
    assert isinstance(e.error, dict) and "Authorization data is wrong" in e.error["message"]
    assert rig.fake.runs_for_execution(str(eid)) == []


@pytest.mark.parametrize("ffqn", [SLOW, FAST])
async def test_operator_attaches_the_id_and_the_next_tick_reconciles_normally(
    make_rig: MakeRig, client: httpx.AsyncClient, ffqn: str
) -> None:
    rig, eid = await timed_out_trigger(make_rig, ffqn, "hang")
    run_id = rig.fake.runs_for_execution(str(eid))[0].run_id

    response = await client.put(f"/v1/executions/{eid}/resolve", json={
        "action": "attach", "external_execution_id": run_id,
        "reason": "found it in n8n's execution list", "by": "alice"})

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "running" and body["external_execution_id"] == run_id
    assert body["flagged_at"] is None and body["flag_reason"] is None
    history = await rig.history(eid)
    attached = [ev.data for ev in history if ev.kind == "external_started"]
    assert attached == [{"external_execution_id": run_id, "by": "alice",
                         "reason": "found it in n8n's execution list"}]
    listed = await client.get("/v1/executions", params={"flagged": "true"})
    assert listed.json()["items"] == []

    if ffqn == SLOW:
        quiet = await rig.tick()  # within its limit and running: nothing
        assert quiet.actions == [] and quiet.stops_requested == 0
        rig.fake.finish(run_id, "success")  # the callback is lost (script)
        result = await rig.tick()
        assert result.stops_requested == 0
    else:
        result = await rig.tick()  # breached long ago: stopped, then ended
        assert result.stops_requested == 1
    assert [a.kind for a in result.actions] == ["terminate"]
    assert (await rig.get(eid)).status == Status.FAILED_TRANSIENT
    assert len(rig.fake.runs_for_execution(str(eid))) == 1
    await rig.assert_truthful()


@pytest.mark.parametrize(("action", "status"), [("fail", Status.FAILED_TRANSIENT),
                                                ("cancel", Status.CANCELLED)])
async def test_operator_ends_a_flagged_execution(
    rig: Rig, client: httpx.AsyncClient, action: str, status: Status
) -> None:
    eid = await rig.delegate_only(SLOW)
    await rig.tick()
    assert (await rig.get(eid)).flagged_at is not None

    response = await client.put(f"/v1/executions/{eid}/resolve", json={
        "action": action, "reason": "n8n has no such run", "by": "bob"})

    # without an external id the operator's word is all there is: allowed, and recorded
    # as an end the engine did not confirm
    assert response.status_code == 200, response.text
    assert response.headers["X-Veracity-Resolution"] == "unconfirmed"
    assert response.json()["status"] == status
    e = await rig.get(eid)
    assert e.status == status and e.result is None
    if action == "fail":
        assert e.error == {"code": "operator", "message": "n8n has no such run", "by": "bob",
                           "engine_confirmed": False}
    assert e.flag_kind == "forced" and e.flagged_at is not None
    terminal = await rig.terminal_events(eid)
    assert [ev.kind for ev in terminal] == [str(status)]
    assert terminal[0].data == {
        "by": "bob", "reason": "n8n has no such run", "resolved": True,
        "engine_confirmed": False, "external_execution_id": None,
        "why_unconfirmed": "it has no external id: the engine could not be asked whether "
                           "the run exists, nor stopped"}
    # resolved: the reconciler no longer looks at it
    assert (await rig.tick()).examined == 0
    await rig.assert_truthful()


async def test_resolved_executions_leave_the_flagged_list(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    """The flagged list is the operators' to-do list: once an execution is resolved (attach
    clears its flag) or ended by a callback, it must not stay on it; one ended without the
    engine's confirmation stays on it as forced (its run may still be going there)."""
    failed = await rig.delegate_only(SLOW)
    cancelled = await rig.delegate_only(SLOW)
    attached = await rig.delegate_only(SLOW)
    forgotten = await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.forget(str(forgotten.run_id))  # 404: flagged, then its failure report arrives
    await rig.tick()
    listed = await client.get("/v1/executions", params={"flagged": "true"})
    assert len(listed.json()["items"]) == 4
    for eid, body in ((failed, {"action": "fail"}), (cancelled, {"action": "cancel"}),
                      (attached, {"action": "attach", "external_execution_id": "77"})):
        response = await client.put(f"/v1/executions/{eid}/resolve",
                                    json={**body, "reason": "checked in n8n", "by": "bob"})
        assert response.status_code == 200, response.text
    response = await client.post(
        f"/v1/executions/{forgotten.id}/fail", json={"error": "boom"},
        headers={"Authorization": f"Bearer {callback_token(rig, forgotten.run_id)}"})
    assert response.status_code == 200, response.text
    listed = await client.get("/v1/executions", params={"flagged": "true"})
    still = {item["id"]: (item["status"], item["flag_kind"]) for item in listed.json()["items"]}
    assert still == {str(failed): ("failed_transient", "forced"),
                     str(cancelled): ("cancelled", "forced")}


async def test_resolve_refusals(rig: Rig, client: httpx.AsyncClient) -> None:
    flagged = await rig.delegate_only(SLOW)
    with_id = await rig.start(Script.forever(callback="lose"), SLOW)
    ended = await rig.delegate_only(SLOW)
    assert (await client.put(f"/v1/executions/{ended}/resolve", json={
        "action": "cancel", "reason": "r"})).status_code == 200
    pending = uuid.uuid4()
    await rig.store.execution_submit(NewExecution(ffqn=SLOW, params=[],
                                                  deployment_id=DEPLOYMENT, id=pending))
    claimed_by_worker, _ = await rig.submit_claim(FAST)  # running under a lease, no engine

    async def resolve(eid: object, **body: object) -> httpx.Response:
        return await client.put(f"/v1/executions/{eid}/resolve", json=body)

    # not delegated to an engine, or terminal: 409, nothing changes
    for eid in (pending, claimed_by_worker.id, ended):
        before = await rig.get(eid)
        for action in ("fail", "cancel"):
            response = await resolve(eid, action=action, reason="r")
            assert response.status_code == 409, response.text
        response = await resolve(eid, action="attach", external_execution_id="5", reason="r")
        assert response.status_code == 409, response.text
        assert await rig.get(eid) == before
    # attach over an existing id: 409
    response = await resolve(with_id.id, action="attach", external_execution_id="5",
                             reason="r")
    assert response.status_code == 409, response.text
    assert (await rig.get(with_id.id)).external_execution_id == with_id.run_id

    # bad input: 422 (400 for an id that is not one), 404 for an unknown id
    history = await rig.history(flagged)
    for body, status in (
        ({"action": "retry", "reason": "r"}, 422),
        ({"action": "attach", "reason": "r"}, 422),
        ({"action": "attach", "external_execution_id": "", "reason": "r"}, 422),
        ({"action": "fail"}, 422),
        ({"action": "fail", "reason": ""}, 422),
        ({"action": "fail", "reason": "   "}, 422),
        ({"action": "fail", "reason": "r", "by": ""}, 422),
        ({"action": "fail", "reason": "r", "extra": 1}, 422),
        ({}, 422),
    ):
        response = await resolve(flagged, **body)
        assert response.status_code == status, (body, response.text)
    assert await rig.history(flagged) == history
    assert (await rig.get(flagged)).status == Status.RUNNING
    assert (await resolve(uuid.uuid4(), action="fail", reason="r")).status_code == 404
    assert (await resolve("nope", action="fail", reason="r")).status_code == 400


async def test_veracity_resolve_command(rig: Rig, database_url: str, tmp_path: Path) -> None:
    attach = await rig.delegate_only(SLOW)
    fail = await rig.delegate_only(SLOW)
    env = process_env(database_url)

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            VERACITY, *args, env=env, cwd=str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await cli("resolve", str(attach), "--attach", "12", "--reason",
                               "seen in n8n", "--by", "carol", "--json")
    assert code == 0, err
    assert json.loads(out)["external_execution_id"] == "12"
    code, out, err = await cli("resolve", str(fail), "--fail", "--reason", "gone", "--by", "dan")
    assert code == 0, err
    assert "failed_transient" in out
    # ended without the engine's confirmation: the CLI warns
    assert err.startswith(f"warning: {fail} ended failed_transient WITHOUT the engine's "
                          "confirmation"), err
    terminal = await rig.terminal_events(fail)
    assert terminal[0].data["by"] == "dan" and terminal[0].data["engine_confirmed"] is False
    code, out, err = await cli("resolve", str(fail), "--cancel", "--reason", "again")
    assert code == 1 and "error:" in err
    code, out, err = await cli("resolve", str(attach), "--fail", "--cancel", "--reason", "x")
    assert code == 2
