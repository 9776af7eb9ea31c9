"""``GET /v1/workers``, on both backends: registered workers (as a worker registers itself,
through the store) listed newest first with every field and whether each is live; bad
``limit`` values are ``422`` with the JSON error body and change nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.api._workers import Registered, info, register_workers
from tests.api.test_bad_input import error_problems
from veracity.clock import ManualClock
from veracity.store import Store, open_store

WORKER_FIELDS = {"id", "host", "pid", "deployment_id", "workflows", "upgrade_auto",
                 "concurrency", "started_at", "last_heartbeat", "stopped_at",
                 "heartbeat_interval", "live"}


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert value.tzinfo is not None, text
    return value


def check_item(item: dict[str, Any], expected: Registered) -> None:
    assert set(item) == WORKER_FIELDS, item
    w = expected.info
    assert (item["id"], item["host"], item["pid"], item["deployment_id"],
            item["workflows"], item["upgrade_auto"], item["concurrency"],
            item["heartbeat_interval"]) == (
        w.id, w.host, w.pid, w.deployment_id, w.ffqns, w.upgrade_ffqns, w.concurrency,
        w.heartbeat_interval)
    assert parse_time(item["started_at"]) == expected.started_at
    assert parse_time(item["last_heartbeat"]) == expected.started_at
    stopped = item["stopped_at"]
    assert (parse_time(stopped) if stopped else None) == expected.stopped_at
    assert item["live"] is expected.live, item


async def test_no_workers(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/workers")
    assert response.status_code == 200, response.text
    assert response.json() == {"items": [], "next_cursor": None}


async def test_registered_workers_are_listed_newest_first_with_every_field(
    client: httpx.AsyncClient, database_url: str
) -> None:
    registered = await register_workers(database_url)
    response = await client.get("/v1/workers")
    assert response.status_code == 200, response.text
    page = response.json()
    assert set(page) == {"items", "next_cursor"} and page["next_cursor"] is None
    assert [item["id"] for item in page["items"]] == [r.info.id for r in registered]
    for item, expected in zip(page["items"], registered, strict=True):
        check_item(item, expected)

    response = await client.get("/v1/workers", params={"limit": 2})
    assert response.status_code == 200, response.text
    assert [item["id"] for item in response.json()["items"]] == ["w-live", "w-stopped"]
    response = await client.get("/v1/workers", params={"limit": 1000})
    assert response.status_code == 200, response.text
    assert len(response.json()["items"]) == 3


async def test_a_worker_registering_again_is_live_again(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    await register_workers(database_url)
    await store.worker_register(info("w-stopped", pid=222, ffqns=["shop:mail/send.run"]))
    items = {i["id"]: i for i in (await client.get("/v1/workers")).json()["items"]}
    again = items["w-stopped"]
    assert again["live"] is True and again["stopped_at"] is None
    assert (again["pid"], again["workflows"]) == (222, ["shop:mail/send.run"])


async def test_bad_limits_are_422(client: httpx.AsyncClient, database_url: str) -> None:
    await register_workers(database_url)
    failures: list[str] = []
    for limit in ["0", "1001", "abc", "-1", "", "2.5", "9" * 30]:
        response = await client.get("/v1/workers", params={"limit": limit})
        problems = error_problems(response, 422, "invalid_input")
        if not problems and "limit" not in response.json()["error"]["message"]:
            problems.append("the message does not name limit")
        if problems:
            failures.append(f"limit={limit!r}: {problems} -- {response.text[:200]}")
    assert not failures, "\n".join(failures)
    listed = await client.get("/v1/workers")
    assert listed.status_code == 200 and len(listed.json()["items"]) == 3


async def test_a_worker_that_missed_two_heartbeats_is_not_live(
    client: httpx.AsyncClient, database_url: str
) -> None:
    """Liveness follows each worker's own heartbeat interval, not the lease TTL (120 s
    here): 10 s after its last heartbeat, a worker beating every 2 s has missed its beat
    by more than two intervals; one beating every 4 s has not; one that recorded no
    interval (started before workers recorded it) is live for the lease TTL."""
    now = datetime.now(UTC)
    clock = ManualClock(now - timedelta(seconds=10))
    workers = await open_store(database_url, clock=clock)
    try:
        for name, interval in (("w-2s", 2.0), ("w-4s", 4.0), ("w-unknown", None)):
            await workers.worker_register(info(
                name, pid=1, ffqns=["shop:orders/process.run"], deployment_id=f"d-{name}",
                heartbeat_interval=interval))
    finally:
        await workers.close()
    items = {i["id"]: i for i in (await client.get("/v1/workers")).json()["items"]}
    assert {name: (i["live"], i["heartbeat_interval"]) for name, i in items.items()} == {
        "w-2s": (False, 2.0), "w-4s": (True, 4.0), "w-unknown": (True, None)}
    listed = (await client.get("/v1/deployments")).json()["items"]
    live = {d["id"]: d["live_workers"] for d in listed}
    assert (live["d-w-2s"], live["d-w-4s"], live["d-w-unknown"]) == (0, 1, 1)
