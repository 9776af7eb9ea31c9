"""Every path that ends a delegated run is truthful (docs/external.md, "Ending a delegated
run"): an operator's resolve and a cancel ask the engine to stop the run and end the
execution only once the engine confirms it finished; a forced end is recorded as such and
stays flagged; a running delegated run cannot be paused; a stop the engine never confirms
is flagged after ``stop_flag_after``; n8n's start-up window flags nothing. Each end to end
through the fake n8n, whose ground truth the truthfulness checker reads, on both backends.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.reconciler._support import (
    CANCELLABLE,
    CLOSED_URL,
    DEPLOYMENT,
    FAST,
    FAST_LIMIT,
    MAX_PAYLOAD,
    OWNER,
    SLOW,
    VERACITY,
    Rig,
    callback_token,
    eventually,
    external_config,
    metric_value,
    process_env,
)
from veracity.adapters.looks import Looker
from veracity.adapters.n8n import N8nEngine
from veracity.api import create_api
from veracity.control import ExecutionService, ServiceMetrics
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.core.states import Status
from veracity.models import Claim, NewExecution, ReconcileAction
from veracity.testing.fake_n8n import FakeN8n, Script, Wait
from veracity.worker.trigger import trigger

PARENT = "shop:orders/parent.run-cancellable"


@dataclass
class Api:
    client: httpx.AsyncClient
    registry: CollectorRegistry

    async def resolve(self, eid: uuid.UUID, **body: Any) -> httpx.Response:
        body.setdefault("reason", "checked in n8n")
        body.setdefault("by", "ada")
        return await self.client.put(f"/v1/executions/{eid}/resolve", json=body)

    async def cancel(self, eid: uuid.UUID) -> httpx.Response:
        return await self.client.put(f"/v1/executions/{eid}/cancel")

    async def pause(self, eid: uuid.UUID) -> httpx.Response:
        return await self.client.put(f"/v1/executions/{eid}/pause")

    async def metrics(self) -> str:
        response = await self.client.get("/metrics")
        assert response.status_code == 200
        return response.text


def looker_for(rig: Rig, *, stop_flag_after: float = 600.0) -> Looker:
    return Looker({"n8n": rig.engine}, rig.external.limits, engine_timeout=5.0,
                  trigger_grace={"n8n": 6.0}, stop_flag_after=stop_flag_after)


async def api_over(rig: Rig) -> AsyncIterator[Api]:
    registry = CollectorRegistry()
    service = ExecutionService(
        rig.store, workflows={FAST, SLOW, CANCELLABLE, PARENT}, deployment_id=DEPLOYMENT,
        max_payload_bytes=MAX_PAYLOAD, looker=looker_for(rig), metrics=ServiceMetrics(registry))
    app = create_api(service, max_payload_bytes=MAX_PAYLOAD, registry=registry)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://veracity") as client:
        yield Api(client, registry)


@pytest.fixture
async def api(rig: Rig) -> AsyncIterator[Api]:
    """The API in-process over the rig's store, with the rig's engine to ask."""
    async for a in api_over(rig):
        yield a


async def running_run(rig: Rig, ffqn: str = SLOW, **script: Any) -> tuple[uuid.UUID, str]:
    """A run going on in the engine, with its external id recorded."""
    started = await rig.start(Script.forever(callback="lose", **script), ffqn)
    assert started.outcome.startswith("started"), started.outcome
    assert started.run_id is not None
    return started.id, started.run_id


# -- an operator's resolve ------------------------------------------------------------------


@pytest.mark.parametrize(("action", "to"), [("fail", Status.FAILED_TRANSIENT),
                                            ("cancel", Status.CANCELLED)])
async def test_resolve_stops_the_run_then_ends_it(
    rig: Rig, api: Api, action: str, to: Status
) -> None:
    eid, run_id = await running_run(rig)
    assert rig.truth(run_id).going

    response = await api.resolve(eid, action=action, reason="customer withdrew")

    assert response.status_code == 200, response.text
    assert response.headers["X-Veracity-Resolution"] == "ended"
    assert response.json()["status"] == to
    assert not rig.truth(run_id).going  # the engine stopped it first
    e = await rig.get(eid)
    assert e.status == to and e.end_request is None and e.flag_kind is None
    if to == Status.FAILED_TRANSIENT:
        assert e.error == {"code": "operator", "message": "customer withdrew", "by": "ada",
                           "engine_confirmed": True}
    kinds = await rig.kinds(eid)
    assert kinds[-2:] == ["end_requested", str(to)]
    ended = (await rig.history(eid))[-1]
    assert ended.data["by"] == "ada" and ended.data["engine_confirmed"] is True
    assert ended.data["engine_status"] == "canceled"
    await rig.assert_truthful()


async def test_resolve_answers_202_until_the_engine_confirms_then_the_reconciler_ends_it(
    rig: Rig, api: Api
) -> None:
    eid, run_id = await running_run(rig, ignore_stops=1)  # the first stop is only claimed

    response = await api.resolve(eid, action="fail", reason="stuck")

    assert response.status_code == 202, response.text
    assert response.headers["X-Veracity-Resolution"] == "stop_requested"
    assert response.json()["status"] == "running"
    assert response.json()["end_request"] == {"action": "fail", "reason": "stuck", "by": "ada"}
    assert rig.truth(run_id).going
    await rig.assert_truthful()

    result = await rig.tick()  # asks again: this time the engine stops it

    assert [(a.kind, a.to) for a in result.actions] == [
        (WriteKind.TERMINATE, Status.FAILED_TRANSIENT)]
    assert not rig.truth(run_id).going
    e = await rig.get(eid)
    assert e.status == Status.FAILED_TRANSIENT
    assert e.error == {"code": "operator", "message": "stuck", "by": "ada",
                       "engine_confirmed": True}
    await rig.assert_truthful()


async def test_resolve_with_the_engine_down_is_409_and_the_request_waits_for_it(
    rig: Rig, api: Api, fake: FakeN8n
) -> None:
    eid, _ = await running_run(rig, ffqn=SLOW)
    fake.kill()  # while down every engine request answers 503
    try:
        response = await api.resolve(eid, action="cancel", reason="gone")
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "engine_not_confirmed"
        assert "503" in error["message"] and "force" in error["message"]
        e = await rig.get(eid)
        assert e.status == Status.RUNNING
        assert e.end_request == {"action": "cancel", "reason": "gone", "by": "ada"}
        assert (await rig.kinds(eid))[-1] == "end_requested"
        assert "veracity_resolutions_total" in await api.metrics()
        assert metric_value(await api.metrics(), "veracity_resolutions_total",
                            action="cancel", outcome="not_confirmed") == 1
    finally:
        fake.start()
    # the engine is back (the kill ended its run: crashed): the next tick carries the
    # operator's request out
    await rig.tick()
    e = await rig.get(eid)
    assert e.status == Status.CANCELLED
    assert (await rig.history(eid))[-1].data["by"] == "ada"
    await rig.assert_truthful()


async def test_resolve_on_n8n_1x_without_a_login_is_409_saying_why(
    rig: Rig, fake: FakeN8n
) -> None:
    """n8n 1.x has no public stop endpoint; without a login for its session stop, the
    engine cannot be asked to stop the run."""
    eid, run_id = await running_run(rig)
    external = external_config(rig.base_url, CLOSED_URL, login=False)
    engine = N8nEngine(external.engines["n8n"])
    try:
        bare = Rig(fake, rig.base_url, rig.store, external, engine, started=rig.started)
        async for a in api_over(bare):
            response = await a.resolve(eid, action="fail")
            assert response.status_code == 409, response.text
            assert response.json()["error"]["code"] == "engine_not_confirmed"
            assert "login_email_env" in response.json()["error"]["message"]
    finally:
        await engine.aclose()
    assert rig.truth(run_id).going
    assert (await rig.get(eid)).status == Status.RUNNING
    await rig.assert_truthful()


@pytest.mark.parametrize(("action", "to"), [("fail", Status.FAILED_TRANSIENT),
                                            ("cancel", Status.CANCELLED)])
async def test_forced_resolve_ends_it_flagged_as_forced_and_counted(
    rig: Rig, api: Api, action: str, to: Status
) -> None:
    eid, _ = await running_run(rig)
    rig.fake.kill()
    try:
        response = await api.resolve(eid, action=action, reason="n8n is gone", force=True)
    finally:
        rig.fake.start()

    assert response.status_code == 200, response.text
    assert response.headers["X-Veracity-Resolution"] == "forced"
    body = response.json()
    assert body["status"] == to and body["flag_kind"] == "forced"
    assert "without the engine's confirmation" in body["flag_reason"]
    last = (await rig.history(eid))[-1]
    assert last.kind == str(to)
    assert last.data["engine_confirmed"] is False and "503" in last.data["why_unconfirmed"]
    listed = await api.client.get("/v1/executions", params={"flagged": "true"})
    assert [i["id"] for i in listed.json()["items"]] == [str(eid)]
    text = await api.metrics()
    assert metric_value(text, "veracity_resolutions_total", action=action,
                        outcome="forced") == 1
    assert metric_value(text, "veracity_flagged_executions", kind="forced") == 1
    await rig.assert_truthful()  # the kill had really ended the run


async def test_force_is_only_for_fail_and_cancel_of_delegated_runs(
    rig: Rig, api: Api
) -> None:
    eid, _ = await running_run(rig)
    plain, _ = await rig.submit_claim(FAST)  # a worker's run: not delegated
    before = await rig.history(eid)
    response = await api.resolve(eid, action="attach", external_execution_id="9", force=True)
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_force"
    response = await api.resolve(plain.id, action="fail", force=True)
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_force"
    response = await api.resolve(eid, action="cancel", force="yes")
    assert response.status_code == 422
    assert await rig.history(eid) == before
    # not delegated, without force: 409 wrong_state as before
    response = await api.resolve(plain.id, action="fail")
    assert response.status_code == 409 and response.json()["error"]["code"] == "wrong_state"


# -- cancel ------------------------------------------------------------------------------------


async def test_cancel_of_a_running_delegated_run_stops_it_then_ends_cancelled(
    rig: Rig, api: Api
) -> None:
    eid, run_id = await running_run(rig, CANCELLABLE)

    response = await api.cancel(eid)

    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    assert not rig.truth(run_id).going
    kinds = await rig.kinds(eid)
    assert kinds[-2:] == ["cancel_requested", "cancelled"]
    assert (await rig.history(eid))[-1].data["cause"] == "cancel"
    await rig.assert_truthful()


async def test_cancel_the_engine_did_not_take_is_carried_out_by_the_reconciler(
    rig: Rig, api: Api
) -> None:
    eid, run_id = await running_run(rig, CANCELLABLE, stop_failures=1)

    response = await api.cancel(eid)

    assert response.status_code == 200, response.text
    assert response.json()["status"] == "running"
    assert response.json()["cancel_requested_at"] is not None
    assert rig.truth(run_id).going
    await rig.tick()
    assert (await rig.get(eid)).status == Status.CANCELLED
    assert not rig.truth(run_id).going
    await rig.assert_truthful()


async def test_a_callback_that_wins_the_race_with_a_cancel_stands(
    rig: Rig, api: Api, client: httpx.AsyncClient
) -> None:
    eid, run_id = await running_run(rig, CANCELLABLE, ignore_stops=5)
    response = await api.cancel(eid)
    assert response.status_code == 200 and response.json()["status"] == "running"
    rig.fake.finish(run_id, "success", result={"shipped": True})  # n8n finishes it first

    response = await client.post(
        f"/v1/executions/{eid}/complete", json={"result": {"shipped": True}},
        headers={"Authorization": f"Bearer {callback_token(rig, run_id)}"})

    assert response.status_code == 200, response.text
    e = await rig.get(eid)
    assert (e.status, e.result) == (Status.COMPLETED, {"shipped": True})
    ended, lost = (await rig.history(eid))[-2:]
    assert (ended.kind, ended.data["by"]) == ("completed", "callback")
    assert (lost.kind, lost.data["report"]) == ("late_report", "cancel")
    assert lost.data["reason"] == "the execution ended completed before the cancellation " \
        "reached it"
    await rig.assert_truthful()


async def test_a_callback_that_wins_the_race_with_an_operator_request_stands(
    rig: Rig, api: Api, client: httpx.AsyncClient
) -> None:
    eid, run_id = await running_run(rig, ignore_stops=5)
    response = await api.resolve(eid, action="fail", reason="too slow")
    assert response.status_code == 202, response.text
    rig.fake.finish(run_id, "error", error="card declined")

    response = await client.post(
        f"/v1/executions/{eid}/fail", json={"error": "card declined"},
        headers={"Authorization": f"Bearer {callback_token(rig, run_id)}"})

    assert response.status_code == 200, response.text
    e = await rig.get(eid)
    assert (e.status, e.error, e.end_request) == (Status.FAILED, "card declined", None)
    last = (await rig.history(eid))[-1]
    assert last.kind == "failed"
    [lost] = last.data["overtook"]
    assert (lost["request"], lost["by"]) == ("resolve fail", "ada")
    assert lost["outcome"] == "the engine reported first; its outcome stands"
    await rig.assert_truthful()


async def test_a_pending_delegated_execution_is_cancelled_without_being_triggered(
    rig: Rig, api: Api
) -> None:
    eid = uuid.uuid4()
    await rig.store.execution_submit(NewExecution(ffqn=CANCELLABLE, params=[],
                                                  deployment_id=DEPLOYMENT, id=eid))
    response = await api.cancel(eid)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert await rig.store.execution_claim(OWNER, [CANCELLABLE], limit=10,
                                           lease_ttl=timedelta(seconds=60)) == []
    assert rig.fake.runs_for_execution(str(eid)) == []


@pytest.mark.parametrize("request_", ["cancel", "pause"])
async def test_a_claimed_execution_asked_to_stop_before_its_trigger_is_never_triggered(
    rig: Rig, api: Api, request_: str
) -> None:
    """A worker has claimed it, but not yet sent the trigger: the request is carried out
    when the worker records the trigger, and nothing is sent to the engine."""
    execution, claim = await rig.submit_claim(CANCELLABLE)
    response = await (api.cancel(execution.id) if request_ == "cancel"
                      else api.pause(execution.id))
    assert response.status_code == 200 and response.json()["status"] == "running"
    assert rig.external.public_url is not None

    outcome = await trigger(rig.store, rig.engine, rig.external.workflows[CANCELLABLE],
                            execution, claim, rig.external.public_url)

    expected = Status.CANCELLED if request_ == "cancel" else Status.PAUSED
    assert outcome == f"not triggered: {expected} before the trigger"
    assert (await rig.get(execution.id)).status == expected
    assert rig.fake.runs_for_execution(str(execution.id)) == []


async def test_cancel_reaching_a_delegated_child_stops_it_and_ends_the_tree(
    rig: Rig, api: Api
) -> None:
    parent = uuid.uuid4()
    await rig.store.execution_submit(NewExecution(ffqn=PARENT, params=[],
                                                  deployment_id=DEPLOYMENT, id=parent))
    [p] = await rig.store.execution_claim("parent-worker", [PARENT], limit=1,
                                          lease_ttl=timedelta(seconds=60))
    pclaim = Claim(parent, "parent-worker", p.lease_epoch)
    child = uuid.uuid4()
    spawned = await rig.store.execution_spawn_if_owned(pclaim, [NewExecution(
        ffqn=CANCELLABLE, params=[], deployment_id=DEPLOYMENT, id=child, parent_id=parent,
        join_set="js")], [("child_submitted", {"child_id": str(child), "pos": 0,
                                                "ffqn": CANCELLABLE, "join_set": "js"})])
    assert spawned.applied
    blocked = await rig.store.execution_block_if_owned(
        pclaim, wake_at=None, seen_signal=p.signal_seq, events=[], reason="waiting for js")
    assert blocked.applied and blocked.execution is not None
    assert blocked.execution.status == Status.BLOCKED
    [c] = await rig.store.execution_claim(OWNER, [CANCELLABLE], limit=1,
                                          lease_ttl=timedelta(seconds=60))
    rig.started.append(child)
    rig.fake.script_for_execution(str(child), Script.forever(callback="lose"))
    assert rig.external.public_url is not None
    outcome = await trigger(rig.store, rig.engine, rig.external.workflows[CANCELLABLE], c,
                            Claim(child, OWNER, c.lease_epoch), rig.external.public_url)
    assert outcome.startswith("started")
    [run] = rig.fake.runs_for_execution(str(child))

    response = await api.cancel(parent)

    # the parent waits for its child, which runs in the engine: both still unfinished
    assert response.status_code == 200 and response.json()["status"] == "blocked"
    assert (await rig.get(child)).status == Status.RUNNING
    assert rig.truth(run.run_id).going
    await rig.tick()  # the reconciler stops the child's run, then ends it cancelled
    assert not rig.truth(run.run_id).going
    assert (await rig.get(child)).status == Status.CANCELLED
    assert (await rig.get(parent)).status == Status.CANCELLED
    await rig.assert_truthful()


# -- pause -------------------------------------------------------------------------------------


async def test_a_running_delegated_run_cannot_be_paused(rig: Rig, api: Api) -> None:
    eid, run_id = await running_run(rig)
    before = await rig.history(eid)

    response = await api.pause(eid)

    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "not_pausable" and error["state"] == "running"
    assert "cancel" in error["message"] and "resolve" in error["message"]
    assert await rig.history(eid) == before
    assert (await rig.get(eid)).pause_requested_at is None
    assert rig.truth(run_id).going


async def test_a_delegated_execution_not_yet_triggered_can_be_paused(
    rig: Rig, api: Api
) -> None:
    eid = uuid.uuid4()
    await rig.store.execution_submit(NewExecution(ffqn=SLOW, params=[],
                                                  deployment_id=DEPLOYMENT, id=eid))
    response = await api.pause(eid)
    assert response.status_code == 200 and response.json()["status"] == "paused"
    assert rig.fake.runs_for_execution(str(eid)) == []


# -- a stop the engine never confirms ------------------------------------------------------------


async def test_an_unstoppable_run_past_its_limit_is_flagged_after_stop_flag_after(
    rig: Rig
) -> None:
    # long enough that the first tick comes before it even on a busy machine (the tick
    # after the breach must only ask for the stop)
    flag_after = 3.0
    eid, run_id = await running_run(rig, FAST, ignore_stops=1000)
    triggered = (await rig.get(eid)).triggered_at
    assert triggered is not None
    service = rig.service(looker=looker_for(rig, stop_flag_after=flag_after))
    await asyncio.sleep(FAST_LIMIT + 0.05)

    first = await service.run_once()  # stop requested, ignored; not flagged yet

    assert first.stops_requested == 1 and first.actions == []
    assert (await rig.get(eid)).flagged_at is None
    # flagged once the stop has gone unconfirmed for stop_flag_after since the breach
    due = triggered + timedelta(seconds=FAST_LIMIT + flag_after)
    while await rig.store.db_now() < due:
        await asyncio.sleep(0.05)

    second = await service.run_once()

    assert [(a.kind, a.flag) for a in second.actions] == [
        (WriteKind.FLAG, FlagKind.STOP_UNCONFIRMED)]
    e = await rig.get(eid)
    assert e.status == Status.RUNNING
    assert (e.flag_kind, e.flag_reason) == (
        "stop_unconfirmed", "limit breached; the engine did not confirm the stop")
    assert rig.sample("veracity_reconciler_actions_total", kind="flag") == 1
    assert rig.sample("veracity_reconciler_actions_total", kind="stop") == 2
    assert rig.truth(run_id).going  # still running in the engine: that is the truth
    third = await service.run_once()  # asked again, the flag stays as it was
    assert third.actions == [] and third.stops_requested == 1
    await rig.assert_truthful()


# -- n8n's start-up window -------------------------------------------------------------------


async def test_an_n8n_restart_flags_nothing_and_a_stale_not_found_flag_clears(
    rig: Rig
) -> None:
    """Seen on a real n8n 1.123: for about 4 s while it starts, n8n answers
    GET /api/v1/executions/{id} with 404 and an HTML body (Cannot GET ...); that is not
    "unknown id". A flag an earlier version raised on it clears itself once a look finds
    the run."""
    started = await rig.start(Script(steps=(Wait(None),), callback="lose"), SLOW)
    assert started.run_id is not None
    eid = started.id
    await eventually(lambda: rig.truth(started.run_id).status == "waiting", what="waiting")
    # as an earlier version flagged it on that HTML 404
    e = await rig.get(eid)
    old = ReconcileAction(eid, e.external_execution_id, WriteKind.FLAG,
                          "the engine does not know external id (404)",
                          flag=FlagKind.UNKNOWN_ID)
    assert await rig.store.execution_reconcile_apply([old]) == [old]

    rig.fake.restart(starting_for=30.0)  # a waiting run survives a restart
    during = await rig.tick()

    assert during.examined == 1 and during.actions == []
    assert rig.engine_errors("not_ready") == 1
    e = await rig.get(eid)
    assert e.status == Status.RUNNING and e.flag_kind == "unknown_id"  # untouched

    rig.fake.restart()  # up, its API mounted
    after = await rig.tick()

    assert [a.kind for a in after.actions] == [WriteKind.UNFLAG]
    e = await rig.get(eid)
    assert (e.status, e.flagged_at, e.flag_kind) == (Status.RUNNING, None, None)
    assert (await rig.kinds(eid))[-1] == "unflagged"
    await rig.assert_truthful()



# -- the CLI -----------------------------------------------------------------------------------


async def test_veracity_resolve_force_warns_and_pause_explains(
    rig: Rig, database_url: str, tmp_path: Path
) -> None:
    """Without a configuration the CLI has no engine to ask: a resolve that would end a
    run with an external id is refused saying why; --force ends it, with a warning."""
    eid, run_id = await running_run(rig)
    claimed, _ = await rig.submit_claim(SLOW)  # claimed by a worker, not triggered yet
    env = process_env(database_url)

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            VERACITY, *args, env=env, cwd=str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await cli("pause", str(eid))
    assert code == 1 and "cannot pause a run" in err, (out, err)
    code, out, err = await cli("pause", str(claimed.id))
    assert code == 0 and "pause requested: it parks at its next step" in out, (out, err)

    code, out, err = await cli("resolve", str(eid), "--fail", "--reason", "gone")
    assert code == 1, (out, err)
    assert err.startswith("error: the engine could not confirm the run has finished: its "
                          "engine 'n8n' is not configured here"), err
    assert (await rig.get(eid)).status == Status.RUNNING

    code, out, err = await cli("resolve", str(eid), "--fail", "--reason", "gone", "--force",
                               "--by", "eve")
    assert code == 0, err
    assert err.startswith(f"warning: {eid} ended failed_transient WITHOUT the engine's "
                          "confirmation"), err
    e = await rig.get(eid)
    assert (e.status, e.flag_kind) == (Status.FAILED_TRANSIENT, "forced")
    # an unconfirmed end on purpose: the run does go on in the engine, and the checker
    # says so -- the one case where Veracity records a terminal state over a live run is
    # the operator's explicit, flagged force
    assert rig.truth(run_id).going
    violations = rig.fake.truthful_violations(await rig.terminal_times())
    assert len(violations) == 1 and str(eid) in violations[0]
