"""``GET /v1/deployments``, ``POST /v1/deployments/{id}/adopt`` and ``waiting_reason`` of
stranded executions (docs/deployments.md), on both backends. Workers are registered through
the store, as a worker registers itself; the server's deployment (``d-test``) is recorded
as a server records it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import DEPLOYMENT, MAX_PAYLOAD, stable
from tests.api.test_bad_input import assert_error
from veracity.api import create_api
from veracity.clock import ManualClock
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.models import NewExecution, WorkerInfo
from veracity.store import Store, open_store

ORDERS = "shop:orders/process.run"
MAIL = "shop:mail/send.run"
MONITOR = "shop:monitor/stock.run-cancellable"
OLD = "d-old"
UNFINISHED = {"pending", "running", "blocked", "paused"}
READY = "ready: waiting for a worker to claim it"


def worker(name: str, deployment_id: str, ffqns: list[str],
           upgrade_ffqns: list[str] | None = None) -> WorkerInfo:
    return WorkerInfo(id=name, host="h", pid=1, deployment_id=deployment_id, ffqns=ffqns,
                      concurrency=4, upgrade_ffqns=upgrade_ffqns or [])


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class World:
    """d-old: recorded an hour ago, its worker stopped; d-test (the server's, current):
    recorded now, one live worker running ORDERS and MAIL, MAIL with upgrade="auto"."""

    def __init__(self, store: Store, service: ExecutionService, old: ExecutionService):
        self.store, self.service, self.old = store, service, old
        self.ids: dict[str, uuid.UUID] = {}

    async def build(self, database_url: str) -> World:
        now = datetime.now(UTC)
        past = await open_store(database_url, clock=ManualClock(now - timedelta(hours=1)))
        try:
            await past.deployment_seen(OLD)
            await past.worker_register(worker("w-old", OLD, [ORDERS, MAIL, MONITOR]))
            await past.worker_stop("w-old")
        finally:
            await past.close()
        await self.store.deployment_seen(DEPLOYMENT)
        await self.store.worker_register(worker("w-new", DEPLOYMENT, [ORDERS, MAIL], [MAIL]))
        for name, (svc, ffqn, paused) in {
            "old_orders": (self.old, ORDERS, False),
            "old_mail": (self.old, MAIL, False),
            "old_paused": (self.old, ORDERS, True),
            "old_monitor": (self.old, MONITOR, False),
            "new_orders": (self.service, ORDERS, False),
            "new_monitor": (self.service, MONITOR, False),
        }.items():
            e, _ = await svc.submit(ffqn, ["o-1", 100] if ffqn == ORDERS else ["x"],
                                    paused=paused)
            self.ids[name] = e.id
        return self


@pytest.fixture
async def world(store: Store, service: ExecutionService, database_url: str) -> World:
    old = ExecutionService(store, workflows=set(shop.app.workflows), deployment_id=OLD)
    return await World(store, service, old).build(database_url)


async def reasons(client: httpx.AsyncClient, world: World) -> dict[str, str | None]:
    listed = (await client.get("/v1/executions", params={"limit": 100})).json()["items"]
    by_id = {item["id"]: item["waiting_reason"] for item in listed}
    out = {name: by_id[str(ident)] for name, ident in world.ids.items()}
    for name, ident in world.ids.items():  # GET says the same as the list
        one = (await client.get(f"/v1/executions/{ident}")).json()
        assert one["waiting_reason"] == out[name], (name, one)
    return out


async def test_waiting_reason_says_why_no_live_worker_will_run_it(
    client: httpx.AsyncClient, world: World, store: Store
) -> None:
    assert await reasons(client, world) == {
        "old_orders": f"no live worker for deployment {OLD}",  # stranded
        "old_mail": READY,  # upgrade="auto": d-test's worker takes it
        # stranded, paused or not
        "old_paused": f"submitted paused; no live worker for deployment {OLD}",
        "old_monitor": f"no live worker runs {MONITOR}",  # nobody runs it at all
        "new_orders": READY,
        "new_monitor": f"no live worker runs {MONITOR}",
    }
    # another deployment's live worker runs MONITOR now: d-test's still does not
    await store.worker_register(worker("w-x", "d-x", [MONITOR]))
    got = await reasons(client, world)
    assert got["new_monitor"] == f"no live worker of deployment {DEPLOYMENT} runs {MONITOR}"
    assert got["old_monitor"] == f"no live worker for deployment {OLD}"


async def test_deployments_listing_newest_first_with_counts(
    client: httpx.AsyncClient, world: World, store: Store
) -> None:
    # submitted by a process of a deployment no server or worker recorded
    await store.execution_submit(NewExecution(ffqn=ORDERS, params=["o-9", 1],
                                              deployment_id="d-cli", id=uuid.uuid4()))
    response = await client.get("/v1/deployments")
    assert response.status_code == 200, response.text
    page = response.json()
    assert set(page) == {"items", "next_cursor"} and page["next_cursor"] is None
    items = page["items"]
    assert [i["id"] for i in items] == [DEPLOYMENT, OLD, "d-cli"]
    for item in items:
        assert set(item) == {"id", "current", "first_seen", "last_seen", "unfinished",
                             "live_workers", "stranded"}, item
        assert set(item["unfinished"]) == UNFINISHED
    new, old, cli = items
    assert (new["current"], old["current"], cli["current"]) == (True, False, False)
    assert new["unfinished"] == {"pending": 2, "running": 0, "blocked": 0, "paused": 0}
    assert (new["live_workers"], new["stranded"]) == (1, 0)
    assert old["unfinished"] == {"pending": 3, "running": 0, "blocked": 0, "paused": 1}
    # old_orders, old_paused and old_monitor; not old_mail (auto)
    assert (old["live_workers"], old["stranded"]) == (0, 3)
    assert parse_time(old["first_seen"]) < parse_time(new["first_seen"])
    assert parse_time(new["first_seen"]) <= parse_time(new["last_seen"])
    assert (cli["first_seen"], cli["last_seen"], cli["stranded"]) == (None, None, 1)


async def test_adopt_moves_the_stranded_executions_onto_the_current_deployment(
    client: httpx.AsyncClient, world: World
) -> None:
    response = await client.post(f"/v1/deployments/{OLD}/adopt",
                                 json={"ffqn_prefix": "shop:orders/", "by": "ada"})
    assert response.status_code == 200, response.text
    body = response.json()
    moved = sorted([world.ids["old_orders"], world.ids["old_paused"]])
    assert body == {"from": OLD, "to": DEPLOYMENT, "count": 2, "ids": [str(i) for i in moved]}
    for ident in moved:
        execution = (await client.get(f"/v1/executions/{ident}")).json()
        assert execution["deployment_id"] == DEPLOYMENT
        history = (await client.get(f"/v1/executions/{ident}/history")).json()["items"]
        assert (history[-1]["kind"], history[-1]["data"]) == (
            "adopted", {"from": OLD, "to": DEPLOYMENT, "by": "ada"})
    got = await reasons(client, world)
    assert got["old_orders"] == READY  # d-test's live worker runs it now
    assert got["old_paused"] == "submitted paused"
    assert got["old_monitor"] == f"no live worker runs {MONITOR}"  # not adopted: kept d-old
    items = {i["id"]: i for i in (await client.get("/v1/deployments")).json()["items"]}
    assert items[OLD]["stranded"] == 1
    assert items[DEPLOYMENT]["unfinished"]["paused"] == 1

    # the rest, without a body: every unfinished execution of d-old
    rest = await client.post(f"/v1/deployments/{OLD}/adopt")
    assert rest.status_code == 200, rest.text
    assert rest.json()["count"] == 2  # old_mail and old_monitor
    history = (await client.get(
        f"/v1/executions/{world.ids['old_mail']}/history")).json()["items"]
    assert history[-1]["data"] == {"from": OLD, "to": DEPLOYMENT, "by": "operator"}
    again = await client.post(f"/v1/deployments/{OLD}/adopt", json={})
    assert again.json() == {"from": OLD, "to": DEPLOYMENT, "count": 0, "ids": []}


async def snapshot(client: httpx.AsyncClient) -> Any:
    listed = (await client.get("/v1/executions", params={"limit": 100})).json()["items"]
    histories = {}
    for item in listed:
        histories[item["id"]] = (await client.get(
            f"/v1/executions/{item['id']}/history")).json()["items"]
    return [stable(i) for i in listed], histories


async def test_adopt_refusals_write_nothing(
    client: httpx.AsyncClient, world: World, store: Store
) -> None:
    before = await snapshot(client)
    url = f"/v1/deployments/{OLD}/adopt"
    cases: list[tuple[str, Any, int, str]] = [
        ("/v1/deployments/d-nobody/adopt", {}, 404, "not_found"),
        (f"/v1/deployments/{'x' * 129}/adopt", {}, 422, "invalid_deployment_id"),
        (f"/v1/deployments/{DEPLOYMENT}/adopt", {}, 422, "same_deployment"),
        (url, {"ffqn_prefix": "Shop:"}, 422, "invalid_ffqn_prefix"),
        (url, {"ffqn_prefix": "shop:orders//"}, 422, "invalid_ffqn_prefix"),
        (url, {"ffqn_prefix": "shop orders"}, 422, "invalid_ffqn_prefix"),
        (url, {"ffqn_prefix": "shop\x00"}, 422, "invalid_ffqn_prefix"),
        (url, {"ffqn_prefix": ""}, 422, "invalid_input"),
        (url, {"ffqn_prefix": "s" * 513}, 422, "invalid_input"),
        (url, {"ffqn_prefix": 7}, 422, "invalid_input"),
        (url, {"prefix": "shop:"}, 422, "invalid_input"),
        (url, {"by": ""}, 422, "invalid_input"),
        (url, "[not json", 422, "malformed_json"),
    ]
    for path, body, status, code in cases:
        if isinstance(body, str):
            response = await client.post(path, content=body,
                                         headers={"content-type": "application/json"})
        else:
            response = await client.post(path, json=body)
        assert_error(response, status, code)
    assert await snapshot(client) == before

    # a deployment with a live worker: its executions are not stranded
    await store.worker_register(worker("w-old-again", OLD, [ORDERS]))
    assert_error(await client.post(url, json={}), 409, "deployment_live")
    await store.worker_stop("w-old-again")
    assert await snapshot(client) == before

    # adopting onto a deployment no server or worker ever recorded: nothing would run them
    other = ExecutionService(store, workflows=set(shop.app.workflows),
                             deployment_id="d-never-started")
    transport = httpx.ASGITransport(app=create_api(other, max_payload_bytes=MAX_PAYLOAD))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        response = await c.post(url, json={})
    assert_error(response, 409, "unknown_target")
    assert "d-never-started" in response.json()["error"]["message"]
    assert await snapshot(client) == before
