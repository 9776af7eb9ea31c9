"""``veracity deployments`` and ``veracity deployments adopt`` as real processes against real
databases (docs/deployments.md): the listing as a table and as JSON, adopt onto the
process's own deployment with its history events, and every refusal as one ``error:`` line,
exit 1, nothing written."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.cli.test_cli import assert_failure, base_env, ok, ok_json, run, run_all, table_rows
from tests.conftest import run_async
from veracity.clock import ManualClock
from veracity.models import Claim, NewExecution, WorkerInfo
from veracity.store import open_store

ORDERS = "shop:orders/process.run"
MAIL = "shop:mail/send.run"
COLUMNS = ["ID", "CURRENT", "FIRST SEEN", "LAST SEEN", "LIVE WORKERS", "PENDING", "RUNNING",
           "BLOCKED", "PAUSED", "STRANDED"]


async def setup(database_url: str) -> dict[str, uuid.UUID]:
    """d1 recorded an hour ago (its worker gone) with one MAIL execution completed and an
    ORDERS and a MAIL one pending; d2 recorded now."""
    now = datetime.now(UTC)
    store = await open_store(database_url, clock=ManualClock(now - timedelta(hours=1)))
    ids: dict[str, uuid.UUID] = {}
    try:
        await store.deployment_seen("d1")

        async def submit(ffqn: str) -> uuid.UUID:
            new = NewExecution(ffqn=ffqn, params=["x", 1], deployment_id="d1",
                               id=uuid.uuid4())
            return (await store.execution_submit(new)).execution.id

        ids["done"] = await submit(MAIL)
        (claimed,) = await store.execution_claim("w-gone", [MAIL], limit=1,
                                                 lease_ttl=timedelta(minutes=1),
                                                 deployment_id="d1")
        assert (await store.execution_complete_if_owned(
            Claim(claimed.id, "w-gone", claimed.lease_epoch), "sent")).applied
        ids["orders"] = await submit(ORDERS)
        ids["mail"] = await submit(MAIL)
    finally:
        await store.close()
    store = await open_store(database_url)
    try:
        await store.deployment_seen("d2")
    finally:
        await store.close()
    return ids


async def history(database_url: str, execution_id: uuid.UUID) -> list[Any]:
    store = await open_store(database_url)
    try:
        return [(e.kind, e.data) for e in await store.history_list(execution_id)]
    finally:
        await store.close()


async def register(database_url: str, info: WorkerInfo) -> None:
    store = await open_store(database_url)
    try:
        await store.worker_register(info)
    finally:
        await store.close()


def test_deployments_list_and_adopt(database_url: str, tmp_path: Path) -> None:
    ids = run_async(setup(database_url))
    env = {**base_env(database_url), "VERACITY_DEPLOYMENT_ID": "d2"}
    listed = run_all({"table": (["deployments"], env, tmp_path),
                      "json": (["deployments", "--json"], env, tmp_path)})
    rows = table_rows(ok(listed["table"]), COLUMNS)
    assert [(r["ID"], r["CURRENT"], r["LIVE WORKERS"], r["PENDING"], r["STRANDED"])
            for r in rows] == [("d2", "*", "0", "0", "0"), ("d1", "", "0", "2", "2")]
    page = ok_json(listed["json"])
    assert [i["id"] for i in page["items"]] == ["d2", "d1"] and page["next_cursor"] is None
    d1 = page["items"][1]
    assert d1["unfinished"] == {"pending": 2, "running": 0, "blocked": 0, "paused": 0}
    assert (d1["current"], d1["stranded"], d1["live_workers"]) == (False, 2, 0)

    adopted = ok_json(run(["deployments", "adopt", "d1", "--ffqn-prefix", "shop:orders/",
                           "--by", "ada", "--json"], env, tmp_path))
    assert adopted == {"from": "d1", "to": "d2", "count": 1, "ids": [str(ids["orders"])]}
    assert run_async(history(database_url, ids["orders"]))[-1] == (
        "adopted", {"from": "d1", "to": "d2", "by": "ada"})

    text = ok(run(["deployments", "adopt", "d1"], {**env, "USER": "bob"}, tmp_path))
    assert text.splitlines() == ["adopted 1 execution of d1 onto d2", str(ids["mail"])]
    assert run_async(history(database_url, ids["mail"]))[-1] == (
        "adopted", {"from": "d1", "to": "d2", "by": "bob"})
    assert run_async(history(database_url, ids["done"]))[-1][0] == "completed"  # stays d1
    assert ok(run(["deployments", "adopt", "d1"], env, tmp_path)).splitlines() == [
        "adopted 0 executions of d1 onto d2"]
    rows = table_rows(ok(run(["deployments"], env, tmp_path)), COLUMNS)
    assert [(r["ID"], r["PENDING"], r["STRANDED"]) for r in rows] == [
        ("d2", "2", "2"), ("d1", "0", "0")]  # d2 has no live worker yet: stranded there


def test_adopt_refusals(database_url: str, tmp_path: Path) -> None:
    ids = run_async(setup(database_url))
    env = {**base_env(database_url), "VERACITY_DEPLOYMENT_ID": "d2"}
    before = {name: run_async(history(database_url, i)) for name, i in ids.items()}
    results = run_all({
        "unknown": (["deployments", "adopt", "d-nobody"], env, tmp_path),
        "itself": (["deployments", "adopt", "d2"], env, tmp_path),
        "prefix": (["deployments", "adopt", "d1", "--ffqn-prefix", "Shop:"], env, tmp_path),
        "empty": (["deployments", "adopt", "d1", "--ffqn-prefix", ""], env, tmp_path),
        "target": (["deployments", "adopt", "d1"],
                   {**env, "VERACITY_DEPLOYMENT_ID": "d-never-started"}, tmp_path),
    })
    assert_failure(results["unknown"], "deployment d-nobody is unknown")
    assert_failure(results["itself"], "d2 is the current deployment")
    assert_failure(results["prefix"], "'Shop:' cannot begin a workflow name")
    assert_failure(results["empty"], "prefix cannot be empty")
    assert_failure(results["target"], "d-never-started was never recorded")
    run_async(register(database_url, WorkerInfo(
        id="w-back", host="h", pid=1, deployment_id="d1", ffqns=[ORDERS], concurrency=1)))
    assert_failure(run(["deployments", "adopt", "d1"], env, tmp_path),
                   "deployment d1 has 1 live worker")
    after = {name: run_async(history(database_url, i)) for name, i in ids.items()}
    assert after == before
