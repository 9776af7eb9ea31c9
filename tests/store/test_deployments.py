"""Store conformance: deployments (docs/deployments.md) -- the registry (first and last
seen, by servers, worker registrations and heartbeats), the claim by deployment (pinned
and upgrade="auto"), the listing's counts, and adopt. Runs unchanged against every
backend."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.store._support import (
    DB_ERRORS,
    RawSQL,
    assert_history_consistent,
    assert_history_intact,
    new_execution,
)
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, DeploymentSummary, Execution, NewExecution, WorkerInfo
from veracity.store import Store

TTL = timedelta(seconds=30)
LIVE = timedelta(seconds=60)
PINNED = "app:orders/process.run"
AUTO = "app:orders/notify.run"
OTHER = "app:mail/send.run"
NONE = dict.fromkeys(("pending", "running", "blocked", "paused"), 0)


def worker(name: str, deployment_id: str, ffqns: list[str],
           upgrade_ffqns: list[str] | None = None) -> WorkerInfo:
    return WorkerInfo(id=name, host="host-1", pid=1, deployment_id=deployment_id,
                      ffqns=ffqns, concurrency=4, upgrade_ffqns=upgrade_ffqns or [])


async def submit(store: Store, ffqn: str, deployment_id: str, *,
                 paused: bool = False) -> Execution:
    new = dataclasses.replace(new_execution(ffqn, deployment_id=deployment_id), paused=paused)
    return (await store.execution_submit(new)).execution


async def get(store: Store, execution_id: uuid.UUID) -> Execution:
    found = await store.execution_get(execution_id)
    assert found is not None
    return found


def by_id(listing: list[DeploymentSummary]) -> dict[str, DeploymentSummary]:
    return {d.id: d for d in listing}


# -- the registry ------------------------------------------------------------------------------


async def test_deployment_seen_records_first_and_last_seen(
    store: Store, clock: ManualClock
) -> None:
    t0 = clock.now()
    first = await store.deployment_seen("d1")
    assert (first.id, first.first_seen, first.last_seen) == ("d1", t0, t0)
    t1 = clock.advance(10)
    again = await store.deployment_seen("d1")
    assert (again.first_seen, again.last_seen) == (t0, t1)
    clock.advance(-5)  # another server's clock behind: last seen never moves back
    assert (await store.deployment_seen("d1")).last_seen == t1
    assert await store.deployment_get("d1") == again
    assert await store.deployment_get("d2") is None


async def test_deployment_seen_refuses_an_id_out_of_bounds(store: Store) -> None:
    with pytest.raises(DB_ERRORS):
        await store.deployment_seen("x" * 129)
    with pytest.raises(DB_ERRORS):
        await store.deployment_seen("")
    assert await store.deployment_list(live_within=LIVE) == []


async def test_worker_register_and_heartbeat_record_the_workers_deployment(
    store: Store, clock: ManualClock
) -> None:
    t0 = clock.now()
    rec = await store.worker_register(worker("w1", "d1", [PINNED], [PINNED]))
    assert rec.upgrade_ffqns == [PINNED]
    seen = await store.deployment_get("d1")
    assert seen is not None and (seen.first_seen, seen.last_seen) == (t0, t0)
    t1 = clock.advance(7)
    await store.lease_renew("w1", [], TTL)  # the heartbeat, holding nothing
    seen = await store.deployment_get("d1")
    assert seen is not None and (seen.first_seen, seen.last_seen) == (t0, t1)
    t2 = clock.advance(3)
    await store.worker_register(worker("w2", "d1", [PINNED]))  # a second worker of d1
    seen = await store.deployment_get("d1")
    assert seen is not None and (seen.first_seen, seen.last_seen) == (t0, t2)
    assert [w.upgrade_ffqns for w in await store.worker_list()] == [[], [PINNED]]


async def test_a_refused_worker_registration_records_no_deployment(store: Store) -> None:
    with pytest.raises(DB_ERRORS):
        await store.worker_register(dataclasses.replace(worker("w1", "d1", [PINNED]),
                                                        concurrency=0))
    assert await store.deployment_get("d1") is None


# -- the claim by deployment -------------------------------------------------------------------


async def test_claim_takes_only_its_own_deployments_pinned_executions(
    store: Store, clock: ManualClock
) -> None:
    old = await submit(store, PINNED, "d1")
    clock.advance(1)
    ours = await submit(store, PINNED, "d2")
    clock.advance(1)
    claimed = await store.execution_claim("w2", [PINNED], limit=10, lease_ttl=TTL,
                                          deployment_id="d2")
    assert [e.id for e in claimed] == [ours.id]
    assert claimed[0].deployment_id == "d2"
    assert (await get(store, old.id)).status == Status.PENDING
    again = await store.execution_claim("w2", [PINNED], limit=10, lease_ttl=TTL,
                                        deployment_id="d2")
    assert again == []  # d1's stays for d1's workers
    mine = await store.execution_claim("w1", [PINNED], limit=10, lease_ttl=TTL,
                                       deployment_id="d1")
    assert [e.id for e in mine] == [old.id]


async def test_claim_of_an_auto_workflow_takes_every_deployments_and_moves_them(
    store: Store, clock: ManualClock
) -> None:
    old_auto = await submit(store, AUTO, "d1")
    clock.advance(1)
    old_pinned = await submit(store, PINNED, "d1")
    clock.advance(1)
    ours = await submit(store, PINNED, "d2")
    clock.advance(1)
    our_auto = await submit(store, AUTO, "d2")
    clock.advance(1)
    claimed = await store.execution_claim("w2", [PINNED, AUTO], limit=10, lease_ttl=TTL,
                                          deployment_id="d2", upgrade_ffqns=[AUTO])
    # earliest first across both scans; d1's pinned one is not taken
    assert [e.id for e in claimed] == [old_auto.id, ours.id, our_auto.id]
    assert {e.deployment_id for e in claimed} == {"d2"}
    assert (await get(store, old_pinned.id)).status == Status.PENDING
    events = await assert_history_consistent(store, old_auto.id)
    assert events[0].data["deployment_id"] == "d1"  # created under d1 ...
    assert events[-1].kind == "running"
    assert events[-1].data["deployment_id"] == "d2"  # ... run, and now kept, by d2


async def test_claim_limit_applies_across_pinned_and_auto(
    store: Store, clock: ManualClock
) -> None:
    made = []
    for dep, ffqn in [("d1", AUTO), ("d2", PINNED), ("d3", AUTO), ("d2", PINNED)]:
        made.append(await submit(store, ffqn, dep))
        clock.advance(1)
    first = await store.execution_claim("w", [PINNED, AUTO], limit=3, lease_ttl=TTL,
                                        deployment_id="d2", upgrade_ffqns=[AUTO])
    assert [e.id for e in first] == [m.id for m in made[:3]]
    rest = await store.execution_claim("w", [PINNED, AUTO], limit=3, lease_ttl=TTL,
                                       deployment_id="d2", upgrade_ffqns=[AUTO])
    assert [e.id for e in rest] == [made[3].id]


async def test_claim_without_a_deployment_takes_every_deployments(store: Store) -> None:
    a = await submit(store, PINNED, "d1")
    b = await submit(store, PINNED, "d2")
    claimed = await store.execution_claim("tool", [PINNED], limit=10, lease_ttl=TTL)
    assert {e.id for e in claimed} == {a.id, b.id}
    assert {e.deployment_id for e in claimed} == {"d1", "d2"}  # none moved


async def test_claim_refuses_auto_workflows_it_does_not_run(store: Store) -> None:
    ex = await submit(store, PINNED, "d1")
    with pytest.raises(ValueError, match="upgrade_ffqns"):
        await store.execution_claim("w", [PINNED], limit=1, lease_ttl=TTL,
                                    deployment_id="d1", upgrade_ffqns=[AUTO])
    assert (await get(store, ex.id)).status == Status.PENDING


async def test_claim_of_only_auto_workflows(store: Store) -> None:
    a = await submit(store, AUTO, "d1")
    p = await submit(store, PINNED, "d2")
    claimed = await store.execution_claim("w", [AUTO], limit=10, lease_ttl=TTL,
                                          deployment_id="d2", upgrade_ffqns=[AUTO])
    assert [e.id for e in claimed] == [a.id]
    assert (await get(store, p.id)).status == Status.PENDING


@pytest.mark.parametrize("name", ['a"b', "c\\d", "x,{y}", "NULL", " s p ", "ü"])
async def test_claim_finds_workflows_by_their_exact_names(store: Store, name: str) -> None:
    """The claim passes the workflows' names to the database as text arrays (PostgreSQL: a
    literal it builds once per set of names): every name must arrive as itself, in the
    pinned and in the auto scan, and no look-alike may match."""
    pinned = await submit(store, name, "d1")
    auto = await submit(store, name + "-auto", "d0")
    decoy = await submit(store, name.strip() + "x", "d1")
    claimed = await store.execution_claim("w", [name, name + "-auto"], limit=10,
                                          lease_ttl=TTL, deployment_id="d1",
                                          upgrade_ffqns=[name + "-auto"])
    assert {e.id for e in claimed} == {pinned.id, auto.id}
    assert (await get(store, decoy.id)).status == Status.PENDING


# -- the listing ---------------------------------------------------------------------------


async def _running(store: Store, ffqn: str, deployment_id: str, owner: str) -> Claim:
    ex = await submit(store, ffqn, deployment_id)
    (c,) = [e for e in await store.execution_claim(owner, [ffqn], limit=10, lease_ttl=TTL,
                                                   deployment_id=deployment_id)
            if e.id == ex.id]
    return Claim(c.id, owner, c.lease_epoch)


async def test_deployment_list_counts_unfinished_live_workers_and_stranded(
    store: Store, clock: ManualClock
) -> None:
    await store.deployment_seen("d1")  # a server of d1
    await store.worker_register(worker("w1", "d1", [PINNED, AUTO, OTHER], [AUTO]))
    await _running(store, PINNED, "d1", "w1")
    blocked = await _running(store, OTHER, "d1", "w1")
    assert (await store.execution_block_if_owned(
        blocked, wake_at=clock.now() + timedelta(hours=1), seen_signal=0, events=[],
        reason="sleep")).applied
    delegated = await _running(store, OTHER, "d1", "w1")
    assert (await store.execution_delegate_if_owned(delegated, "n8n", "hash")).applied
    done = await _running(store, PINNED, "d1", "w1")
    assert (await store.execution_complete_if_owned(done, "ok")).applied
    await submit(store, PINNED, "d1")
    await submit(store, PINNED, "d1")
    await submit(store, AUTO, "d1")
    await submit(store, OTHER, "d1", paused=True)
    clock.advance(1)
    await store.deployment_seen("d2")
    await store.worker_register(worker("w2", "d2", [PINNED, AUTO], [AUTO]))
    await submit(store, PINNED, "d2")
    await submit(store, PINNED, "d-cli")  # submitted by a process no registry knows

    listing = await store.deployment_list(live_within=LIVE)
    assert [d.id for d in listing] == ["d2", "d1", "d-cli"]  # newest first, unrecorded last
    d1, d2, cli = listing[1], listing[0], listing[2]
    assert d1.unfinished == {"pending": 3, "running": 2, "blocked": 1, "paused": 1}
    assert (d1.live_workers, d1.stranded) == (1, 0)
    assert d2.unfinished == {**NONE, "pending": 1}
    assert (d2.live_workers, d2.stranded) == (1, 0)
    assert (cli.first_seen, cli.last_seen, cli.live_workers, cli.stranded) == (
        None, None, 0, 1)
    assert cli.unfinished == {**NONE, "pending": 1}

    # d1's worker stops: its pinned executions are stranded, its auto one is not (d2's
    # worker takes it), nor the run its engine finishes
    await store.worker_stop("w1")
    d1 = by_id(await store.deployment_list(live_within=LIVE))["d1"]
    # two pending, the running one (its worker is gone), the blocked and the paused one;
    # not the auto pending one, nor the delegated run
    assert (d1.live_workers, d1.stranded) == (0, 2 + 1 + 1 + 1)


async def test_a_worker_with_a_stale_heartbeat_is_not_live(
    store: Store, clock: ManualClock
) -> None:
    await store.worker_register(worker("w1", "d1", [PINNED]))
    await submit(store, PINNED, "d1")
    clock.advance(LIVE)
    assert by_id(await store.deployment_list(live_within=LIVE))["d1"].live_workers == 1
    clock.advance(timedelta(microseconds=1))
    d1 = by_id(await store.deployment_list(live_within=LIVE))["d1"]
    assert (d1.live_workers, d1.stranded) == (0, 1)
    await store.lease_renew("w1", [], TTL)
    assert by_id(await store.deployment_list(live_within=LIVE))["d1"].live_workers == 1


async def test_a_worker_that_missed_two_beats_is_not_live_before_the_lease_ttl(
    store: Store, clock: ManualClock
) -> None:
    """Its heartbeat interval recorded (1 s): not live once its last heartbeat is more than
    three intervals old, however long the live window (the lease TTL) is."""
    await store.worker_register(dataclasses.replace(worker("w1", "d1", [PINNED]),
                                                    heartbeat_interval=1.0))
    await submit(store, PINNED, "d1")
    clock.advance(timedelta(seconds=3))
    assert by_id(await store.deployment_list(live_within=LIVE))["d1"].live_workers == 1
    clock.advance(timedelta(microseconds=1))
    d1 = by_id(await store.deployment_list(live_within=LIVE))["d1"]
    assert (d1.live_workers, d1.stranded) == (0, 1)
    await store.lease_renew("w1", [], TTL)
    assert by_id(await store.deployment_list(live_within=LIVE))["d1"].live_workers == 1


async def test_deployment_list_refuses_a_live_window_that_is_not_positive(
    store: Store
) -> None:
    with pytest.raises(ValueError):
        await store.deployment_list(live_within=timedelta(0))


# -- adopt -------------------------------------------------------------------------------------


async def test_adopt_moves_unfinished_executions_with_their_history(
    store: Store, clock: ManualClock
) -> None:
    await store.deployment_seen("d1")
    await store.deployment_seen("d2")
    pending = await submit(store, PINNED, "d1")
    paused = await submit(store, OTHER, "d1", paused=True)
    done = await _running(store, OTHER, "d1", "w-gone")
    assert (await store.execution_complete_if_owned(done, "ok")).applied
    theirs = await submit(store, PINNED, "d3")
    at = clock.advance(2)

    adopted = await store.deployment_adopt("d1", "d2", ffqn_prefix=None, actor="ada",
                                           live_within=LIVE)
    assert adopted.refused is None
    assert adopted.execution_ids == sorted([pending.id, paused.id])
    for ex in (pending, paused):
        moved = await get(store, ex.id)
        assert moved.deployment_id == "d2" and moved.status == ex.status
        events = await assert_history_intact(
            store, ex.id, first="paused" if ex is paused else "pending")
        assert (events[-1].kind, events[-1].data, events[-1].at) == (
            "adopted", {"from": "d1", "to": "d2", "by": "ada"}, at)
    assert (await get(store, done.execution_id)).deployment_id == "d1"  # terminal: stays
    assert (await get(store, theirs.id)).deployment_id == "d3"
    claimed = await store.execution_claim("w2", [PINNED], limit=10, lease_ttl=TTL,
                                          deployment_id="d2")
    assert [e.id for e in claimed] == [pending.id]

    again = await store.deployment_adopt("d1", "d2", ffqn_prefix=None, actor="ada",
                                         live_within=LIVE)
    assert (again.execution_ids, again.refused) == ([], None)


async def test_adopt_with_a_prefix_moves_only_those_workflows(store: Store) -> None:
    await store.deployment_seen("d2")
    mail = await submit(store, OTHER, "d1")
    order = await submit(store, PINNED, "d1")
    adopted = await store.deployment_adopt("d1", "d2", ffqn_prefix="app:mail/",
                                           actor="ada", live_within=LIVE)
    assert adopted.execution_ids == [mail.id]
    assert (await get(store, order.id)).deployment_id == "d1"
    none = await store.deployment_adopt("d1", "d2", ffqn_prefix="app:nothing",
                                        actor="ada", live_within=LIVE)
    assert none.execution_ids == []


async def _snapshot(store: Store, ids: list[uuid.UUID]) -> list[tuple[Execution, int]]:
    return [(await get(store, i), len(await store.history_list(i))) for i in ids]


async def test_adopt_refusals_change_nothing(store: Store, clock: ManualClock) -> None:
    await store.deployment_seen("d2")
    ex = await submit(store, PINNED, "d1")
    before = await _snapshot(store, [ex.id])

    unknown = await store.deployment_adopt("nope", "d2", ffqn_prefix=None, actor="ada",
                                           live_within=LIVE)
    assert (unknown.code, unknown.execution_ids) == ("not_found", [])
    assert "nope" in (unknown.refused or "")

    target = await store.deployment_adopt("d1", "d-never", ffqn_prefix=None, actor="ada",
                                          live_within=LIVE)
    assert target.code == "unknown_target" and "d-never" in (target.refused or "")

    await store.worker_register(worker("w1", "d1", [PINNED]))
    live = await store.deployment_adopt("d1", "d2", ffqn_prefix=None, actor="ada",
                                        live_within=LIVE)
    assert live.code == "deployment_live" and "1 live worker" in (live.refused or "")

    with pytest.raises(ValueError):
        await store.deployment_adopt("d1", "d1", ffqn_prefix=None, actor="ada",
                                     live_within=LIVE)
    with pytest.raises(ValueError):
        await store.deployment_adopt("d1", "d2", ffqn_prefix="", actor="ada",
                                     live_within=LIVE)
    assert await _snapshot(store, [ex.id]) == before

    clock.advance(LIVE + timedelta(seconds=1))  # its worker's heartbeat is stale now
    adopted = await store.deployment_adopt("d1", "d2", ffqn_prefix=None, actor="ada",
                                           live_within=LIVE)
    assert adopted.execution_ids == [ex.id]


async def test_adopt_of_a_deployment_known_only_by_its_executions(store: Store) -> None:
    await store.deployment_seen("d2")
    ex = await store.execution_submit(new_execution(PINNED, deployment_id="d-cli"))
    adopted = await store.deployment_adopt("d-cli", "d2", ffqn_prefix=None, actor="ada",
                                           live_within=LIVE)
    assert adopted.execution_ids == [ex.execution.id]


async def test_adopt_fails_whole_when_history_insert_fails(
    store: Store, raw: RawSQL
) -> None:
    await store.deployment_seen("d2")
    a = await submit(store, PINNED, "d1")
    b = await submit(store, OTHER, "d1")
    before = await _snapshot(store, [a.id, b.id])
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS):
        await store.deployment_adopt("d1", "d2", ffqn_prefix=None, actor="ada",
                                     live_within=LIVE)
    assert await _snapshot(store, [a.id, b.id]) == before


async def test_adopt_many_executions_at_once(store: Store) -> None:
    await store.deployment_seen("d2")
    made: list[NewExecution] = [new_execution(PINNED, deployment_id="d1") for _ in range(300)]
    for new in made:
        await store.execution_submit(new)
    adopted = await store.deployment_adopt("d1", "d2", ffqn_prefix=None, actor="ada",
                                           live_within=LIVE)
    assert adopted.execution_ids == sorted(n.id for n in made)
    d2 = by_id(await store.deployment_list(live_within=LIVE))["d2"]
    assert d2.unfinished["pending"] == 300


# -- the claim's plan: a worker never reads another deployment's rows -----------------------

BACKLOG = 20_000


def _pg_backlog(url: str) -> None:
    """d1: BACKLOG pending executions due before any of d2's 20 (half pinned, half auto)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
            "scheduled_at, created_at, updated_at, history_seq) "
            "SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN %s ELSE %s END, '[]', "
            "'pending', 'd1', now() - interval '1 hour', now(), now(), 1 "
            "FROM generate_series(1, %s) AS g", [AUTO, PINNED, BACKLOG])
        conn.execute(
            "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
            "scheduled_at, created_at, updated_at, history_seq) "
            "SELECT gen_random_uuid(), %s, '[]', 'pending', 'd2', now(), now(), now(), 1 "
            "FROM generate_series(1, 20)", [PINNED])
        conn.execute("ANALYZE veracity_executions")


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_postgres_claim_reads_only_its_deployments_rows(pg_url: str, plan_mode: str) -> None:
    from veracity.store.postgres.store import Q as PG

    _pg_backlog(pg_url)
    params = {"owner": "w2", "deployment_id": "d2", "pinned": [PINNED], "upgrading": [],
              "limit": 10, "ttl": TTL, "now": None, "from_states": ["pending"]}
    with psycopg.connect(pg_url) as conn:  # one transaction, rolled back: nothing claimed
        conn.execute(f"SET LOCAL plan_cache_mode = {plan_mode}")
        cur = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + PG["execution_claim"], params)
        row = cur.fetchone()
        assert row is not None
        nodes = list(_nodes(row[0][0]["Plan"]))
        conn.rollback()
    scans = [n for n in nodes if n.get("Relation Name") == "veracity_executions"
             and "Scan" in n["Node Type"]]
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], scans
    (due,) = [n for n in scans if n.get("Index Name") == "veracity_executions_unfinished"]
    # it stopped at the LIMIT, and read no row it then threw away (d1's never reached it)
    assert due["Actual Rows"] == 10
    assert due.get("Rows Removed by Filter", 0) == 0
    assert sum(n["Actual Rows"] for n in scans) <= 20, scans

    # a workflow claimed from every deployment: one scan of that workflow's rows, to LIMIT
    params |= {"pinned": [], "upgrading": [AUTO]}
    with psycopg.connect(pg_url) as conn:
        conn.execute(f"SET LOCAL plan_cache_mode = {plan_mode}")
        cur = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + PG["execution_claim"], params)
        row = cur.fetchone()
        assert row is not None
        nodes = list(_nodes(row[0][0]["Plan"]))
        conn.rollback()
    (auto,) = [n for n in nodes if n.get("Index Name") == "veracity_executions_due_ffqn"]
    assert (auto["Actual Rows"], auto.get("Rows Removed by Filter", 0)) == (10, 0)
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"]


def test_sqlite_claim_searches_its_deployments_rows_by_index(sqlite_url: str) -> None:
    from veracity.store.sqlite.store import Q as LITE

    path = sqlite_url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("EXPLAIN QUERY PLAN " + LITE["execution_claim"], {
            "owner": "w2", "deployment_id": "d2", "pinned": json.dumps([PINNED]),
            "upgrading": json.dumps([AUTO]), "limit": 10, "ttl_us": 1, "now": 1,
            "from_states": json.dumps(["pending"])}).fetchall()
    plan = [str(r[3]) for r in rows]
    assert ("SEARCH veracity_executions USING INDEX veracity_executions_unfinished "
            "(deployment_id=? AND status=? AND scheduled_at<?)") in plan, plan
    assert ("SEARCH veracity_executions USING INDEX veracity_executions_due_ffqn "
            "(ffqn=? AND scheduled_at<?)") in plan, plan
    assert not [p for p in plan if p.startswith("SCAN veracity_executions")], plan
