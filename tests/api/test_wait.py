"""GET /v1/executions/{id}?wait= on both backends: answered as soon as the execution ends
(woken by the store's end signals), or with its current state at the timeout; wait values
out of range are 422 invalid_wait."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import count_executions
from veracity.control import ExecutionService
from veracity.models import Claim
from veracity.store import Store

ORDERS = "shop:orders/process.run"
MONITOR = "shop:monitor/stock.run-cancellable"
TTL = timedelta(seconds=60)


@pytest.fixture(autouse=True)
async def close_waits(service: ExecutionService) -> AsyncIterator[None]:
    yield
    await service.close()


async def submitted(client: httpx.AsyncClient, ffqn: str = ORDERS) -> dict[str, Any]:
    params = ["o-1", 5] if ffqn == ORDERS else ["sku"]
    response = await client.post("/v1/executions", json={"ffqn": ffqn, "params": params})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def complete_later(store: Store, ident: str, delay: float, result: Any = "done") -> None:
    await asyncio.sleep(delay)
    (claimed,) = await store.execution_claim("w", [ORDERS], limit=1, lease_ttl=TTL)
    assert str(claimed.id) == ident
    tr = await store.execution_complete_if_owned(
        Claim(claimed.id, "w", claimed.lease_epoch), result)
    assert tr.applied


async def test_a_wait_answers_as_soon_as_the_execution_completes(
    client: httpx.AsyncClient, store: Store
) -> None:
    execution = await submitted(client)
    ender = asyncio.create_task(complete_later(store, execution["id"], 0.3, {"n": 7}))
    started = time.monotonic()
    response = await client.get(f"/v1/executions/{execution['id']}",
                                params={"wait": "20s"})
    waited = time.monotonic() - started
    await ender
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed" and body["result"] == {"n": 7}
    assert 0.25 <= waited < 10, waited  # woken by the end, long before the timeout


async def test_a_wait_times_out_with_the_current_state(
    client: httpx.AsyncClient,
) -> None:
    execution = await submitted(client)
    started = time.monotonic()
    response = await client.get(f"/v1/executions/{execution['id']}",
                                params={"wait": "400ms"})
    waited = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "pending"
    assert response.json()["id"] == execution["id"]
    assert waited >= 0.39, waited


async def test_a_terminal_execution_and_wait_zero_answer_at_once(
    client: httpx.AsyncClient, store: Store, service: ExecutionService
) -> None:
    execution = await submitted(client, MONITOR)
    response = await client.get(f"/v1/executions/{execution['id']}", params={"wait": "0"})
    assert response.status_code == 200 and response.json()["status"] == "pending"
    cancelled = await client.put(f"/v1/executions/{execution['id']}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    started = time.monotonic()
    response = await client.get(f"/v1/executions/{execution['id']}", params={"wait": "60s"})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert time.monotonic() - started < 5
    assert service._waits is None  # nothing had to wait


async def test_a_cancellation_wakes_a_wait(client: httpx.AsyncClient) -> None:
    execution = await submitted(client, MONITOR)

    async def cancel_later() -> None:
        await asyncio.sleep(0.3)
        response = await client.put(f"/v1/executions/{execution['id']}/cancel")
        assert response.status_code == 200

    canceller = asyncio.create_task(cancel_later())
    response = await client.get(f"/v1/executions/{execution['id']}", params={"wait": "20"})
    await canceller
    assert response.json()["status"] == "cancelled"


async def test_many_waits_are_woken_each_by_its_own_end(
    client: httpx.AsyncClient, store: Store, service: ExecutionService
) -> None:
    executions = [await submitted(client) for _ in range(8)]

    async def waited(ident: str) -> str:
        response = await client.get(f"/v1/executions/{ident}", params={"wait": "20s"})
        assert response.status_code == 200, response.text
        status: str = response.json()["status"]
        return status

    waits = [asyncio.create_task(waited(e["id"])) for e in executions]
    while service._waits is None or service._waits.waiting < 8:
        await asyncio.sleep(0.01)
    claimed = await store.execution_claim("w", [ORDERS], limit=8, lease_ttl=TTL)
    half = [c for c in claimed if str(c.id) in {e["id"] for e in executions[:4]}]
    for c in half:
        assert (await store.execution_complete_if_owned(
            Claim(c.id, "w", c.lease_epoch), None)).applied
    done, pending = await asyncio.wait(waits[:4], timeout=10)
    assert not pending and [t.result() for t in done] == ["completed"] * 4
    assert not any(t.done() for t in waits[4:])  # the others still wait
    service.release_waits()  # a server stopping answers the rest at once
    assert [await t for t in waits[4:]] == ["running"] * 4


@pytest.mark.parametrize("value", [
    "61s", "60.5", "-1s", "-0.5", "abc", "1y", "", "30 s s", "nan", "inf", "1e3", "2m",
    "1" * 40, " " * 30 + "5s" + " " * 3,  # over 32 characters: invalid_wait as well
])
async def test_a_wait_out_of_range_is_422(
    client: httpx.AsyncClient, store: Store, value: str
) -> None:
    execution = await submitted(client)
    response = await client.get(f"/v1/executions/{execution['id']}", params={"wait": value})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_wait"
    assert await count_executions(store) == 1


async def test_a_wait_on_an_unknown_or_bad_id(client: httpx.AsyncClient) -> None:
    response = await client.get(f"/v1/executions/{uuid.uuid4()}", params={"wait": "5s"})
    assert response.status_code == 404
    response = await client.get("/v1/executions/not-an-id", params={"wait": "5s"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_id"


@pytest.mark.parametrize("value", ["60s", "1m", "0.5", "500ms", "0s"])
async def test_wait_values_in_range(client: httpx.AsyncClient, store: Store,
                                    value: str) -> None:
    execution = await submitted(client)
    await complete_later(store, execution["id"], 0)
    response = await client.get(f"/v1/executions/{execution['id']}", params={"wait": value})
    assert response.status_code == 200 and response.json()["status"] == "completed"
