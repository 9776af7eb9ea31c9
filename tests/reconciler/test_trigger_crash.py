"""A worker process killed (SIGKILL) between recording the delegation and hearing the
engine's answer: the engine started the run, Veracity never learnt its id. The execution
stays running with its engine set and no external id (the table's fourth row); lease
recovery does not put it back to pending, no worker triggers it again, and the reconciler
flags it for an operator."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.reconciler._support import (
    CLOSED_URL,
    DEPLOYMENT,
    ENV,
    SLOW,
    Rig,
    config_toml,
    eventually,
)
from tests.reconciler.conftest import MakeRig
from tests.worker._procs import Processes, WorkerProcess
from veracity.core.states import Status
from veracity.maintenance.recovery import RecoveryService
from veracity.models import NewExecution
from veracity.testing.fake_n8n import Script

pytestmark = pytest.mark.timeout(60)

LEASE_TTL = 1.5  # tests.worker._procs.FAST_ENV


async def submit(rig: Rig, script: Script) -> uuid.UUID:
    eid = uuid.uuid4()
    rig.fake.script_for_execution(str(eid), script)
    await rig.store.execution_submit(NewExecution(ffqn=SLOW, params=[{"order": "crash"}],
                                                  deployment_id=DEPLOYMENT, id=eid))
    rig.started.append(eid)
    return eid


def start_worker(procs: Processes, database_url: str, tmp_path: Path, fake_url: str,
                 name: str) -> WorkerProcess:
    config = tmp_path / f"{name}.toml"
    # a long engine timeout: the trigger stays in flight until the worker is killed
    config.write_text(config_toml(fake_url, CLOSED_URL, timeout=30.0))
    return procs.worker(database_url, name, env={**ENV, "VERACITY_CONFIG": str(config)})


async def test_worker_killed_while_the_trigger_is_in_flight_is_never_triggered_again(
    make_rig: MakeRig, fake_url: str, database_url: str, procs: Processes, tmp_path: Path
) -> None:
    rig = await make_rig()
    eid = await submit(rig, Script.forever(callback="lose", respond="hang"))

    first = start_worker(procs, database_url, tmp_path, fake_url, "worker1")
    # the engine received the trigger and started the run; its answer never comes
    await eventually(lambda: rig.fake.runs_for_execution(str(eid)), timeout=15,
                     what="the trigger reaching the engine")
    before = await rig.get(eid)
    assert before.status == Status.RUNNING and before.engine == "n8n"
    assert before.external_execution_id is None, "the engine never answered"
    first.kill9()  # while the trigger call is in flight: nothing of the worker runs after

    e = await rig.get(eid)
    assert e.status == Status.RUNNING
    assert e.engine == "n8n" and e.external_execution_id is None
    assert e.triggered_at is not None and e.lease_owner is None
    assert e.flagged_at is None, "the worker died before it could say anything"
    [run] = rig.fake.runs_for_execution(str(eid))
    assert run.going, "the engine's run goes on"

    # lease recovery, once any lease the worker had would have expired: not touched
    await asyncio.sleep(LEASE_TTL + 0.3)
    recovery = await RecoveryService(rig.store, max_attempts=5).run_once()
    assert recovery.ran
    assert str(eid) not in recovery.retried + recovery.failed + recovery.cancelled
    e = await rig.get(eid)
    assert e.status == Status.RUNNING and e.external_execution_id is None
    assert e.attempt == before.attempt

    # another worker: it claims and triggers other work, never this execution again
    second = start_worker(procs, database_url, tmp_path, fake_url, "worker2")
    other = await submit(rig, Script.forever(callback="lose"))

    async def other_started() -> bool:
        return (await rig.get(other)).external_execution_id is not None

    await eventually(other_started, timeout=15, what="the second worker triggering other work")
    await asyncio.sleep(0.5)  # a few more of its polls
    assert second.alive, second.describe()
    assert len(rig.fake.runs_for_execution(str(eid))) == 1, "triggered again"

    # the reconciler: row four, left running and flagged for an operator
    result = await rig.tick()
    assert (eid, "flag") in {(a.execution_id, a.kind) for a in result.actions}
    assert result.stops_requested == 0
    e = await rig.get(eid)
    assert e.status == Status.RUNNING and e.external_execution_id is None
    assert e.flagged_at is not None and e.flag_reason and "no external id" in e.flag_reason
    assert len(rig.fake.runs_for_execution(str(eid))) == 1
    kinds = await rig.kinds(eid)
    assert kinds.count("running") == 1 and kinds.count("trigger_sending") == 1, kinds
    assert "pending" not in kinds[1:], kinds
    await rig.assert_truthful()
