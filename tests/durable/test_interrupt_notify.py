"""Cancel and pause of a RUNNING execution reach a real worker process through PostgreSQL's
NOTIFY, not only its heartbeat.

The worker (``veracity worker``, ``tests.workflows:app``) renews its leases, and asks which
of its runs were cancelled or paused, only every 60 s (lease TTL 120 s); it polls for work
every 30 s. The execution is the cancellable ticker (many 50 ms steps). A cancel or pause
requested through the service the API uses must still stop it within a couple of seconds,
at a step boundary: only the ``veracity_interrupt`` notification can have told the worker.
With notifications off (the control), the same cancel does not reach it in that time.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests import workflows
from tests._helpers import pg_store_fixture
from tests.durable._procs import Processes, WorkerProcess, registered, wait_until
from tests.durable._support import DEPLOYMENT, events, get, history, kinds, submit
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.models import Execution
from veracity.store import Store
from veracity.worker.context import STEP_COMPLETED

TICKER = "test:ticker/tick.run-cancellable"
N_STEPS = 400  # 50 ms each: 20 s or more, far longer than any wait below
SLOW_HEARTBEAT = {"VERACITY_LEASE_TTL": "120", "VERACITY_HEARTBEAT_INTERVAL": "60"}
PROMPT = 3.0  # seconds: "at once", with room for a loaded machine


store = pg_store_fixture(pool_size=4, name="store")


@pytest.fixture
def service(store: Store) -> ExecutionService:
    """The service behind PUT /v1/executions/{id}/cancel, /pause and /unpause."""
    return ExecutionService(store, workflows=set(workflows.app.workflows),
                            deployment_id=DEPLOYMENT)


def start_worker(procs: Processes, url: str, *, notifications: bool) -> WorkerProcess:
    return procs.worker(url, "A", env={
        **SLOW_HEARTBEAT,
        "VERACITY_DEPLOYMENT_ID": DEPLOYMENT,
        "VERACITY_WORKER_NOTIFICATIONS": str(notifications).lower(),
        # with notifications, claims come from NOTIFY too; without, from polling
        "VERACITY_POLL_INTERVAL": "30" if notifications else "0.2",
    })


async def ticking(store: Store, ident: uuid.UUID, owner: str, steps: int,
                  w: WorkerProcess) -> Execution:
    """Wait until the worker runs ``ident`` and has checkpointed ``steps`` steps."""

    async def check() -> Execution | None:
        e = await get(store, ident)
        done = await events(store, ident, STEP_COMPLETED)
        ok = e.status == Status.RUNNING and e.lease_owner == owner and len(done) >= steps
        return e if ok else None

    found = await wait_until(check, 10, interval=0.02, what=f"{steps} steps of {ident}",
                             describe=w.describe)
    assert found is not None
    return found


async def status_within(store: Store, ident: uuid.UUID, status: Status, seconds: float,
                        w: WorkerProcess) -> Execution:
    async def check() -> Execution | None:
        e = await get(store, ident)
        return e if e.status == status else None

    found = await wait_until(check, seconds, interval=0.02, what=f"{ident} to be {status}",
                             describe=w.describe)
    assert found is not None
    return found


def steps_after(ks: list[str], kind: str) -> int:
    return ks[ks.index(kind):].count(STEP_COMPLETED)


async def stop_worker(w: WorkerProcess) -> None:
    w.terminate()
    assert await w.wait(10) == 0, w.describe()


@pytest.mark.timeout(60)
async def test_cancel_of_a_running_execution_arrives_by_notify(
    pg_url: str, store: Store, service: ExecutionService, procs: Processes
) -> None:
    a = start_worker(procs, pg_url, notifications=True)
    (a_id,) = await registered(a)
    ident = (await submit(store, TICKER, N_STEPS)).id
    running = await ticking(store, ident, a_id, 3, a)

    requested, changed = await service.cancel(ident)
    assert changed and requested.status == Status.RUNNING, requested
    assert requested.cancel_requested_at is not None
    done = await status_within(store, ident, Status.CANCELLED, PROMPT, a)
    assert done.result is None and done.lease_owner is None, done
    assert done.attempt == 1 and done.lease_epoch == running.lease_epoch, done
    evs = await history(store, ident)
    ks = [e.kind for e in evs]
    assert ks.count("cancel_requested") == 1 and ks[-1] == "cancelled", ks
    assert evs[-1].data["reason"] == "cancel requested; stopped at its next await", evs[-1]
    assert evs[-1].data["owner"] == a_id, evs[-1]
    # stopped at the step boundary right after the notification: the step in flight,
    # perhaps one more; nowhere near the 60 s heartbeat
    assert steps_after(ks, "cancel_requested") <= 3, ks
    assert ks.count(STEP_COMPLETED) < N_STEPS
    assert "late_report" not in ks and ks.count("running") == 1, ks
    await asyncio.sleep(0.3)  # and nothing more is written after it
    assert await kinds(store, ident) == ks
    assert a.alive, a.describe()
    await stop_worker(a)


@pytest.mark.timeout(60)
async def test_pause_of_a_running_execution_arrives_by_notify_and_unpause_resumes_it(
    pg_url: str, store: Store, service: ExecutionService, procs: Processes
) -> None:
    a = start_worker(procs, pg_url, notifications=True)
    (a_id,) = await registered(a)
    ident = (await submit(store, TICKER, N_STEPS)).id
    await ticking(store, ident, a_id, 3, a)

    requested, changed = await service.pause(ident)
    assert changed and requested.status == Status.RUNNING, requested
    assert requested.pause_requested_at is not None
    parked = await status_within(store, ident, Status.PAUSED, PROMPT, a)
    assert parked.lease_owner is None and parked.lease_expires_at is None, parked
    assert parked.pause_requested_at is None, parked
    evs = await history(store, ident)
    ks = [e.kind for e in evs]
    assert ks[-1] == "paused", ks
    assert evs[-1].data["reason"] == "pause requested; parked at a step boundary"
    assert evs[-1].data["owner"] == a_id, evs[-1]
    assert steps_after(ks, "pause_requested") <= 3, ks
    done_before = [e.data["pos"] for e in evs if e.kind == STEP_COMPLETED]
    assert done_before == list(range(len(done_before))), done_before

    # unpaused: back to pending, and the NOTIFY of that wakes the worker (it polls every
    # 30 s), which resumes it from its checkpoints; then a cancel reaches the new run too
    await asyncio.sleep(0.3)
    assert await kinds(store, ident) == ks  # parked: nothing runs
    resumed, changed = await service.unpause(ident)
    assert changed and resumed.status == Status.PENDING, resumed
    await ticking(store, ident, a_id, len(done_before) + 2, a)
    await service.cancel(ident)
    done = await status_within(store, ident, Status.CANCELLED, PROMPT, a)
    assert done.attempt == 1, done
    after = await history(store, ident)
    positions = [e.data["pos"] for e in after if e.kind == STEP_COMPLETED]
    assert positions == list(range(len(positions))), positions  # none ran twice
    ks = [e.kind for e in after]
    assert ks.count("running") == 2 and ks.count("paused") == 1, ks
    assert ks[ks.index("paused") + 1] == "pending" and ks[-1] == "cancelled", ks
    assert a.alive, a.describe()
    await stop_worker(a)


@pytest.mark.timeout(60)
async def test_without_notifications_a_cancel_waits_for_the_heartbeat(
    pg_url: str, store: Store, service: ExecutionService, procs: Processes
) -> None:
    """The control: the same worker without LISTEN is not told within PROMPT seconds; the
    run goes on checkpointing steps with its cancel requested."""
    a = start_worker(procs, pg_url, notifications=False)
    (a_id,) = await registered(a)
    ident = (await submit(store, TICKER, N_STEPS)).id
    await ticking(store, ident, a_id, 3, a)
    await service.cancel(ident)
    at_request = len(await events(store, ident, STEP_COMPLETED))
    await asyncio.sleep(PROMPT)
    e = await get(store, ident)
    assert e.status == Status.RUNNING and e.cancel_requested_at is not None, e
    assert len(await events(store, ident, STEP_COMPLETED)) > at_request + 10
    await stop_worker(a)  # SIGTERM: it stops at a step boundary and lets go
