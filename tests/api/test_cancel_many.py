"""PUT /v1/executions/cancel on both backends: up to 1,000 cancels in one request, each as
the single cancel answers it, in order; the bad input the route lists (over 1,000 ids:
413; an id that is not a UUID: 422 naming its index) with nothing written; and the path
not taken for an execution id by the /v1/executions/{id} routes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.api.conftest import DEPLOYMENT, stable
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.store import Store

ORDERS = "shop:orders/process.run"
MONITOR = "shop:monitor/stock.run-cancellable"
PAYLOAD = 64 * 1024
C = "/v1/executions/cancel"


@pytest.fixture
async def http(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    service = ExecutionService(store, workflows=set(shop.app.workflows),
                               deployment_id=DEPLOYMENT, max_payload_bytes=PAYLOAD)
    api: FastAPI = create_api(service, max_payload_bytes=PAYLOAD)
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def submit(http: httpx.AsyncClient, ffqn: str = MONITOR) -> str:
    response = await http.post("/v1/executions", json={
        "ffqn": ffqn, "params": ["o", 1] if ffqn == ORDERS else ["sku"]})
    assert response.status_code == 201, response.text
    ident: str = response.json()["id"]
    return ident


async def read(http: httpx.AsyncClient, ident: str) -> dict[str, Any]:
    got: dict[str, Any] = (await http.get(f"/v1/executions/{ident}")).json()
    return got


async def test_each_id_is_answered_in_order_as_its_single_cancel(
    http: httpx.AsyncClient
) -> None:
    a, b = await submit(http), await submit(http)
    legacy = await submit(http, ORDERS)
    done = await submit(http)
    assert (await http.put(f"/v1/executions/{done}/cancel")).status_code == 200
    done_before = await read(http, done)
    legacy_before = await read(http, legacy)
    unknown = str(uuid.uuid4())

    response = await http.put(C, json={"ids": [b, unknown, legacy, done, a], "by": "ops"})
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [i["id"] for i in items] == [b, unknown, legacy, done, a]
    for ident, item in zip((a, b), (items[4], items[0]), strict=True):
        assert item["error"] is None
        assert item["execution"]["status"] == "cancelled"
        assert stable(item["execution"]) == stable(await read(http, ident))
        history = (await http.get(f"/v1/executions/{ident}/history")).json()["items"]
        assert history[-1]["kind"] == "cancelled" and history[-1]["data"]["by"] == "ops"
    assert items[1]["execution"] is None and items[1]["error"]["code"] == "not_found"
    assert items[2]["execution"] is None
    assert items[2]["error"]["code"] == "not_cancellable"
    assert stable(await read(http, legacy)) == stable(legacy_before)
    # terminal: answered unchanged, as the single cancel answers it
    assert items[3]["error"] is None
    assert stable(items[3]["execution"]) == stable(done_before)
    assert stable(await read(http, done)) == stable(done_before)

    # a repeat is fine and changes nothing
    again = await http.put(C, json={"ids": [a, b]})
    assert again.status_code == 200, again.text
    assert [stable(i["execution"]) for i in again.json()["items"]] == [
        stable(await read(http, a)), stable(await read(http, b))]


async def test_more_than_1000_ids_is_refused_and_nothing_changes(
    http: httpx.AsyncClient
) -> None:
    a = await submit(http)
    before = await read(http, a)
    response = await http.put(C, json={"ids": [a] + [str(uuid.uuid4()) for _ in range(1000)]})
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "payload_too_large" and "1,001" in error["message"]
    assert stable(await read(http, a)) == stable(before)


@pytest.mark.parametrize("bad", ["not-an-id", 7, None, "0" * 100])
async def test_a_bad_id_is_named_by_its_index_and_nothing_changes(
    http: httpx.AsyncClient, bad: Any
) -> None:
    a, b = await submit(http), await submit(http)
    before = [await read(http, a), await read(http, b)]
    response = await http.put(C, json={"ids": [a, b, bad]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_id" and error["index"] == 2
    assert "ids[2]" in error["message"]
    assert [stable(await read(http, i)) for i in (a, b)] == [stable(e) for e in before]


@pytest.mark.parametrize("body", [{"ids": []}, {}, {"ids": "x"}, {"ids": [], "by": ""},
                                  {"ids": ["00000000-0000-4000-8000-000000000000"],
                                   "by": "  "}])
async def test_a_bad_body_is_refused(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await http.put(C, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"


async def test_the_path_is_not_taken_for_an_execution_id(http: httpx.AsyncClient) -> None:
    """GET /v1/executions/cancel answers what it did before the route existed: "cancel" is
    not an execution id."""
    response = await http.get(C)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_id"
    # and the single cancel still answers under its own path
    a = await submit(http)
    assert (await http.put(f"/v1/executions/{a}/cancel")).json()["status"] == "cancelled"
