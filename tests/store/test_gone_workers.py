"""Store conformance: workers whose process is gone (docs/workers.md, "A worker whose
process is gone"). ``worker_running_on`` lists one host key's workers not marked stopped;
``worker_gone`` marks the named (id, pid) registrations stopped and ends their leases now,
only while the registry still names that process with that host key; lease recovery then
takes their executions. Runs unchanged against every backend."""

from __future__ import annotations

from datetime import timedelta

from tests.store._support import new_execution
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, Execution, WorkerInfo
from veracity.store import Store

TTL = timedelta(seconds=60)
FFQN = "app.orders.create"
HERE = "boot-1/pid:[1]"
ELSEWHERE = "boot-2/pid:[1]"


def info(worker_id: str, pid: int, host_key: str | None) -> WorkerInfo:
    return WorkerInfo(id=worker_id, host="host-1", pid=pid, deployment_id="d1",
                      ffqns=[FFQN], concurrency=4, host_key=host_key)


async def running_under(store: Store, owner: str) -> Execution:
    await store.execution_submit(new_execution(FFQN))
    (claimed,) = await store.execution_claim(owner, [FFQN], limit=1, lease_ttl=TTL)
    return claimed


async def get(store: Store, execution: Execution) -> Execution:
    got = await store.execution_get(execution.id)
    assert got is not None
    return got


async def test_the_host_key_is_registered_and_listed_by_host(store: Store) -> None:
    await store.worker_register(info("w1", 101, HERE))
    await store.worker_register(info("w2", 102, ELSEWHERE))
    await store.worker_register(info("w3", 103, None))
    await store.worker_register(info("w4", 104, HERE))
    await store.worker_stop("w4")
    assert {w.id: w.host_key for w in await store.worker_list()} == {
        "w1": HERE, "w2": ELSEWHERE, "w3": None, "w4": HERE}
    assert [w.id for w in await store.worker_running_on(HERE)] == ["w1"]
    assert [w.id for w in await store.worker_running_on(ELSEWHERE)] == ["w2"]
    assert await store.worker_running_on("boot-3/pid:[1]") == []


async def test_a_gone_workers_leases_end_now_and_recovery_takes_its_executions(
    store: Store, clock: ManualClock
) -> None:
    await store.worker_register(info("w1", 101, HERE))
    await store.worker_register(info("w2", 102, HERE))
    lost = await running_under(store, "w1")
    kept = await running_under(store, "w2")
    clock.advance(1)
    assert await store.execution_recover_expired(max_attempts=5) == []  # leases hold
    assert await store.worker_gone(HERE, [("w1", 101)]) == 1
    stopped = {w.id: w.stopped_at for w in await store.worker_list()}
    assert stopped == {"w1": clock.now(), "w2": None}
    assert (await get(store, lost)).lease_expires_at == clock.now()
    assert (await get(store, kept)).lease_expires_at == kept.lease_expires_at
    recovered = await store.execution_recover_expired(max_attempts=5)
    assert [r.execution.id for r in recovered] == [lost.id]
    assert recovered[0].previous_owner == "w1"
    after = await get(store, lost)
    assert (after.status, after.lease_owner, after.attempt) == (Status.PENDING, None, 2)
    assert (await get(store, kept)).status == Status.RUNNING
    # the dead owner's fenced write is refused: its lease is gone
    done = await store.execution_complete_if_owned(lost_claim(lost), {"late": True})
    assert not done.applied


def lost_claim(e: Execution) -> Claim:
    assert e.lease_owner is not None
    return Claim(e.id, e.lease_owner, e.lease_epoch)


async def test_nothing_changes_unless_the_registry_still_names_that_process(
    store: Store, clock: ManualClock
) -> None:
    await store.worker_register(info("w1", 101, HERE))
    e1 = await running_under(store, "w1")
    await store.worker_register(info("w2", 102, ELSEWHERE))
    e2 = await running_under(store, "w2")
    await store.worker_register(info("w3", 103, HERE))
    await store.worker_stop("w3")
    clock.advance(1)
    assert await store.worker_gone(HERE, [("w1", 999)]) == 0  # w1 runs as another pid now
    assert await store.worker_gone(HERE, [("w2", 102)]) == 0  # w2 is on another host
    assert await store.worker_gone(HERE, [("w3", 103)]) == 0  # w3 stopped already
    assert await store.worker_gone(HERE, [("nobody", 1)]) == 0
    assert await store.worker_gone(HERE, []) == 0
    for e in (e1, e2):
        now = await get(store, e)
        assert (now.status, now.lease_expires_at) == (Status.RUNNING, e.lease_expires_at)
    assert [w.id for w in await store.worker_list() if w.stopped_at is not None] == ["w3"]


async def test_a_worker_found_gone_twice_ends_its_leases_once(
    store: Store, clock: ManualClock
) -> None:
    await store.worker_register(info("w1", 101, HERE))
    await running_under(store, "w1")
    await running_under(store, "w1")
    assert await store.worker_gone(HERE, [("w1", 101)]) == 2
    clock.advance(1)
    assert await store.worker_gone(HERE, [("w1", 101)]) == 0  # marked stopped: not again
