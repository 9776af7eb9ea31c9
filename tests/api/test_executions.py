"""The HTTP API's happy paths, on both backends: submission (idempotent), get, list with
filters and keyset pagination, history, health and the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from tests.api.conftest import DEPLOYMENT, count_executions, stable
from veracity.api.schemas import ExecutionOut
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.models import Claim
from veracity.store import Store

ORDERS = "shop:orders/process.run"
MAIL = "shop:mail/send.run"
MONITOR = "shop:monitor/stock.run-cancellable"

EXECUTION_FIELDS = {
    "id", "ffqn", "params", "status", "result", "error", "attempt", "deployment_id",
    "parent_id", "created_at", "updated_at",
}


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert value.tzinfo is not None, text
    return value


async def submit(client: httpx.AsyncClient, ffqn: str = ORDERS, *params: Any,
                 **extra: Any) -> dict[str, Any]:
    response = await client.post("/v1/executions",
                                 json={"ffqn": ffqn, "params": list(params), **extra})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def list_ids(client: httpx.AsyncClient, **query: Any) -> list[str]:
    response = await client.get("/v1/executions", params={"limit": 1000, **query})
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["next_cursor"] is None
    return [item["id"] for item in page["items"]]


# -- submission -------------------------------------------------------------------------


async def test_submit_answers_201_with_every_execution_field(
    client: httpx.AsyncClient, store: Store
) -> None:
    before = datetime.now(UTC)
    response = await client.post("/v1/executions", json={"ffqn": ORDERS, "params": ["o-1", 250]})
    assert response.status_code == 201, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert EXECUTION_FIELDS <= body.keys()
    uuid.UUID(body["id"])
    assert body["ffqn"] == ORDERS
    assert body["params"] == ["o-1", 250]
    assert body["status"] == "pending"
    assert body["result"] is None
    assert body["error"] is None
    assert body["attempt"] == 1
    assert body["deployment_id"] == DEPLOYMENT
    assert body["parent_id"] is None
    assert body["idempotency_key"] is None
    created = parse_time(body["created_at"])
    assert parse_time(body["updated_at"]) == created
    # the database's clock, not ours: allow some skew but it must be "now"
    assert abs(created - before) < timedelta(minutes=1)
    # no scheduled_at means claimable at once
    assert parse_time(body["scheduled_at"]) <= created + timedelta(seconds=1)
    # durable when the call returns
    stored = await store.execution_get(uuid.UUID(body["id"]))
    assert stored is not None
    assert stored.params == ["o-1", 250]
    assert await count_executions(store) == 1


async def test_params_default_to_an_empty_list(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/executions", json={"ffqn": MONITOR})
    assert response.status_code == 201, response.text
    assert response.json()["params"] == []


async def test_params_keep_any_json_value(client: httpx.AsyncClient) -> None:
    params = ["text", 1, 2.5, True, None, {"nested": [1, {"a": "é✓"}]}, []]
    body = await submit(client, ORDERS, *params)
    got = await client.get(f"/v1/executions/{body['id']}")
    assert got.json()["params"] == params


async def test_body_just_under_the_payload_limit_is_accepted(
    client: httpx.AsyncClient, store: Store
) -> None:
    # the limit is 2048 bytes for the whole body; ~1900 bytes must pass
    response = await client.post("/v1/executions", json={"ffqn": ORDERS, "params": ["x" * 1850]})
    assert response.status_code == 201, response.text
    assert await count_executions(store) == 1


async def test_scheduled_at_is_stored(client: httpx.AsyncClient) -> None:
    body = await submit(client, MAIL, "a@example.com", "hi",
                        scheduled_at="2030-01-02T03:04:05+02:00")
    assert parse_time(body["scheduled_at"]) == datetime(2030, 1, 2, 1, 4, 5, tzinfo=UTC)
    got = (await client.get(f"/v1/executions/{body['id']}")).json()
    assert parse_time(got["scheduled_at"]) == datetime(2030, 1, 2, 1, 4, 5, tzinfo=UTC)


async def test_same_idempotency_key_returns_the_same_execution_with_200(
    client: httpx.AsyncClient, store: Store
) -> None:
    request = {"ffqn": ORDERS, "params": ["o-7"], "idempotency_key": "order-7"}
    first = await client.post("/v1/executions", json=request)
    again = await client.post("/v1/executions", json=request)
    assert first.status_code == 201, first.text
    assert again.status_code == 200, again.text
    assert stable(again.json()) == stable(first.json())
    assert first.json()["idempotency_key"] == "order-7"
    assert await count_executions(store) == 1


async def test_same_instant_in_another_timezone_is_the_same_request(
    client: httpx.AsyncClient, store: Store
) -> None:
    base = {"ffqn": MAIL, "params": ["a", "b"], "idempotency_key": "k-tz"}
    first = await client.post("/v1/executions",
                              json={**base, "scheduled_at": "2031-05-05T12:00:00Z"})
    again = await client.post("/v1/executions",
                              json={**base, "scheduled_at": "2031-05-05T14:00:00+02:00"})
    assert first.status_code == 201, first.text
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert await count_executions(store) == 1


async def test_explicit_empty_params_match_omitted_params(client: httpx.AsyncClient) -> None:
    first = await client.post("/v1/executions", json={"ffqn": MONITOR, "idempotency_key": "m"})
    again = await client.post("/v1/executions",
                              json={"ffqn": MONITOR, "params": [], "idempotency_key": "m"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]


async def test_same_key_with_a_different_body_is_a_conflict(
    client: httpx.AsyncClient, store: Store
) -> None:
    original = {"ffqn": MAIL, "params": ["a@example.com", "hi"], "idempotency_key": "mail-1",
                "scheduled_at": "2030-01-01T00:00:00Z"}
    created = await client.post("/v1/executions", json=original)
    assert created.status_code == 201, created.text
    variants = [
        {**original, "params": ["b@example.com", "hi"]},
        {**original, "params": ["a@example.com", "hi", "extra"]},
        {**original, "ffqn": ORDERS},
        {**original, "scheduled_at": "2030-01-01T00:00:01Z"},
        {key: value for key, value in original.items() if key != "scheduled_at"},
    ]
    for variant in variants:
        response = await client.post("/v1/executions", json=variant)
        assert response.status_code == 409, (variant, response.text)
        error = response.json()["error"]
        assert error["code"] == "idempotency_conflict"
        assert "mail-1" in error["message"]
    assert await count_executions(store) == 1
    got = (await client.get(f"/v1/executions/{created.json()['id']}")).json()
    assert stable(got) == stable(created.json())


async def test_concurrent_submissions_with_one_key_create_one_execution(
    client: httpx.AsyncClient, store: Store
) -> None:
    request = {"ffqn": ORDERS, "params": ["race"], "idempotency_key": "race-1"}
    responses = await asyncio.gather(
        *(client.post("/v1/executions", json=request) for _ in range(10))
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 9 + [201], [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert await count_executions(store) == 1
    history = await store.history_list(uuid.UUID(responses[0].json()["id"]))
    assert [ev.kind for ev in history] == ["pending"]


async def test_concurrent_submissions_are_each_answered_as_alone(
    client: httpx.AsyncClient, store: Store, service: ExecutionService
) -> None:
    stored = await submit(client, MAIL, "a@example.com", "hi", idempotency_key="mail-k")
    requests: list[dict[str, Any]] = [
        *({"ffqn": ORDERS, "params": [f"o-{i}"]} for i in range(12)),
        {"ffqn": MAIL, "params": ["a@example.com", "hi"], "idempotency_key": "mail-k"},
        {"ffqn": MAIL, "params": ["b@example.com", "hi"], "idempotency_key": "mail-k"},
        {"ffqn": ORDERS, "params": ["twice"], "idempotency_key": "new-k"},
        {"ffqn": ORDERS, "params": ["twice"], "idempotency_key": "new-k"},
    ]
    responses = await asyncio.gather(*(client.post("/v1/executions", json=r)
                                       for r in requests))
    # they arrived together and shared transactions (veracity/grouping.py), yet each is
    # answered as it would be alone: created, repeated, or its own conflict
    assert service.groups.groups >= 1
    codes = [r.status_code for r in responses]
    assert codes[:12] == [201] * 12, [r.text for r in responses]
    assert codes[12:14] == [200, 409]
    assert responses[12].json()["id"] == stored["id"]
    assert responses[13].json()["error"]["code"] == "idempotency_conflict"
    assert sorted(codes[14:]) == [200, 201]
    assert responses[14].json()["id"] == responses[15].json()["id"]
    for response in responses[:12]:
        got = (await client.get(f"/v1/executions/{response.json()['id']}")).json()
        assert stable(got) == stable(response.json())
    assert await count_executions(store) == 1 + 12 + 1


@pytest.mark.parametrize("extra", [{}, {"idempotency_key": "k-\u00fc \"q\"",
                                      "scheduled_at": "2030-01-02T03:04:05+02:00",
                                      "paused": True}], ids=["plain", "keyed-scheduled-paused"])
async def test_a_submission_answers_the_models_json(
    client: httpx.AsyncClient, store: Store, extra: dict[str, Any]
) -> None:
    """The route writes its answer's text itself (no model built): it must be what the
    execution's model gives, when created (201) and when repeated (200)."""
    request = {"ffqn": MAIL, "params": ["a@example.com", {"n": [1, 2.5, None]}], **extra}
    for status in (201, 200) if extra else (201,):
        response = await client.post("/v1/executions", json=request)
        assert response.status_code == status, response.text
        assert response.headers["content-type"] == "application/json"
        stored = await store.execution_get(uuid.UUID(response.json()["id"]))
        assert stored is not None
        assert response.json() == json.loads(ExecutionOut.of(stored).model_dump_json())


async def test_different_keys_create_different_executions(
    client: httpx.AsyncClient, store: Store
) -> None:
    a = await submit(client, ORDERS, "x", idempotency_key="a")
    b = await submit(client, ORDERS, "x", idempotency_key="b")
    c = await submit(client, ORDERS, "x")
    d = await submit(client, ORDERS, "x")
    assert len({a["id"], b["id"], c["id"], d["id"]}) == 4
    assert await count_executions(store) == 4


# -- get --------------------------------------------------------------------------------


async def test_get_by_id(client: httpx.AsyncClient) -> None:
    body = await submit(client, MAIL, "to@example.com", "subject")
    response = await client.get(f"/v1/executions/{body['id']}")
    assert response.status_code == 200, response.text
    assert stable(response.json()) == stable(body)


async def test_get_accepts_the_id_in_upper_case(client: httpx.AsyncClient) -> None:
    body = await submit(client, MAIL, "to@example.com", "subject")
    response = await client.get(f"/v1/executions/{body['id'].upper()}")
    assert response.status_code == 200, response.text
    assert response.json()["id"] == body["id"]


async def test_get_unknown_id_is_404(client: httpx.AsyncClient) -> None:
    unknown = uuid.uuid4()
    response = await client.get(f"/v1/executions/{unknown}")
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "not_found"
    assert str(unknown) in error["message"]
    history = await client.get(f"/v1/executions/{unknown}/history")
    assert history.status_code == 404, history.text
    assert history.json()["error"]["code"] == "not_found"


# -- list -------------------------------------------------------------------------------


async def test_list_is_newest_first_with_every_field(client: httpx.AsyncClient) -> None:
    ids = [(await submit(client, ORDERS, f"o-{i}"))["id"] for i in range(4)]
    response = await client.get("/v1/executions")
    assert response.status_code == 200, response.text
    page = response.json()
    assert set(page) == {"items", "next_cursor"}
    assert page["next_cursor"] is None
    assert [item["id"] for item in page["items"]] == ids[::-1]
    for item in page["items"]:
        assert EXECUTION_FIELDS <= item.keys()
    keys = [(parse_time(i["created_at"]), i["id"]) for i in page["items"]]
    assert keys == sorted(keys, reverse=True)


async def test_list_of_an_empty_database(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/executions")
    assert response.status_code == 200, response.text
    assert response.json() == {"items": [], "next_cursor": None}


async def test_list_filters(
    client: httpx.AsyncClient, store: Store, service: ExecutionService
) -> None:
    orders = [(await submit(client, ORDERS, f"o-{i}"))["id"] for i in range(3)]
    mails = [(await submit(client, MAIL, f"m{i}@example.com", "s"))["id"] for i in range(2)]
    other = ExecutionService(store, workflows=set(shop.app.workflows), deployment_id="d-other")
    monitor, _ = await other.submit(MONITOR, ["sku-1"])
    claimed = await store.execution_claim("worker-1", [MAIL], limit=10,
                                          lease_ttl=timedelta(minutes=5))
    assert sorted(str(e.id) for e in claimed) == sorted(mails)
    everything = set(orders) | set(mails) | {str(monitor.id)}
    pending = set(orders) | {str(monitor.id)}

    assert set(await list_ids(client)) == everything
    # status: one, repeated, comma-separated, both at once, one that matches nothing
    assert set(await list_ids(client, status="running")) == set(mails)
    assert set(await list_ids(client, status="pending")) == pending
    assert set(await list_ids(client, status=["pending", "running"])) == everything
    assert set(await list_ids(client, status="running,pending")) == everything
    assert set(await list_ids(client, status=" running , pending ")) == everything
    assert set(await list_ids(client, status=["running", "pending,completed"])) == everything
    assert await list_ids(client, status="completed") == []
    # ffqn_prefix
    assert set(await list_ids(client, ffqn_prefix="shop:mail/")) == set(mails)
    assert set(await list_ids(client, ffqn_prefix="shop:orders")) == set(orders)
    assert set(await list_ids(client, ffqn_prefix="shop:")) == everything
    assert set(await list_ids(client, ffqn_prefix=MONITOR)) == {str(monitor.id)}
    assert await list_ids(client, ffqn_prefix="shop:orders/process.run.x") == []
    assert await list_ids(client, ffqn_prefix="%") == []  # not a LIKE pattern
    assert await list_ids(client, ffqn_prefix="_hop") == []
    # deployment_id
    assert await list_ids(client, deployment_id="d-other") == [str(monitor.id)]
    assert set(await list_ids(client, deployment_id=DEPLOYMENT)) == everything - {
        str(monitor.id)}
    assert await list_ids(client, deployment_id="d-none") == []
    # combined
    assert set(await list_ids(client, status="pending", ffqn_prefix="shop:orders",
                              deployment_id=DEPLOYMENT)) == set(orders)
    assert await list_ids(client, status="running", deployment_id="d-other") == []


async def test_list_created_after_and_before(client: httpx.AsyncClient) -> None:
    items = [await submit(client, ORDERS, f"o-{i}") for i in range(5)]
    times = {item["id"]: parse_time(item["created_at"]) for item in items}
    pivot_low = items[1]["created_at"]
    pivot_high = items[3]["created_at"]
    low, high = parse_time(pivot_low), parse_time(pivot_high)

    def expect(after: datetime | None = None, before: datetime | None = None) -> set[str]:
        return {i for i, t in times.items()
                if (after is None or t > after) and (before is None or t < before)}

    after = set(await list_ids(client, created_after=pivot_low))
    assert after == expect(after=low)
    assert items[4]["id"] in after and items[0]["id"] not in after
    before = set(await list_ids(client, created_before=pivot_high))
    assert before == expect(before=high)
    assert items[0]["id"] in before and items[4]["id"] not in before
    window = set(await list_ids(client, created_after=pivot_low, created_before=pivot_high))
    assert window == expect(after=low, before=high)
    # the same instant written in another timezone selects the same rows
    shifted = low.astimezone(timezone(timedelta(hours=-5))).isoformat()
    assert set(await list_ids(client, created_after=shifted)) == after
    # a window in the past or the future selects nothing
    assert await list_ids(client, created_before="2000-01-01T00:00:00Z") == []
    assert await list_ids(client, created_after="2999-01-01T00:00:00Z") == []


async def walk(client: httpx.AsyncClient, limit: int, **query: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit, **query}
        if cursor is not None:
            params["cursor"] = cursor
        response = await client.get("/v1/executions", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        pages.append([item["id"] for item in page["items"]])
        assert len(page["items"]) <= limit
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "pagination does not end"


async def test_keyset_pagination_walks_every_execution_once(client: httpx.AsyncClient) -> None:
    ids = [(await submit(client, ORDERS, f"o-{i}"))["id"] for i in range(7)]
    newest_first = ids[::-1]
    assert await list_ids(client) == newest_first

    pages = await walk(client, 3)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == newest_first

    pages = await walk(client, 1)
    assert [i for p in pages for i in p] == newest_first
    assert len(pages) == 7  # the last full page knows it is the last

    assert await walk(client, 7) == [newest_first]
    assert await walk(client, 1000) == [newest_first]


async def test_pagination_with_a_filter(client: httpx.AsyncClient) -> None:
    orders = [(await submit(client, ORDERS, f"o-{i}"))["id"] for i in range(3)]
    mails = [(await submit(client, MAIL, f"m{i}", "s"))["id"] for i in range(4)]
    assert orders
    pages = await walk(client, 2, ffqn_prefix="shop:mail/")
    assert [i for p in pages for i in p] == mails[::-1]
    assert [len(p) for p in pages] == [2, 2]


async def test_pagination_is_stable_while_executions_are_added(
    client: httpx.AsyncClient,
) -> None:
    ids = [(await submit(client, ORDERS, f"o-{i}"))["id"] for i in range(6)]
    first = (await client.get("/v1/executions", params={"limit": 2})).json()
    added = [(await submit(client, ORDERS, f"new-{i}"))["id"] for i in range(3)]
    seen = [item["id"] for item in first["items"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = (await client.get("/v1/executions",
                                 params={"limit": 2, "cursor": cursor})).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
    # newer rows land before the cursor: no duplicates, no gaps among the rest
    assert seen == ids[::-1]
    assert not set(added) & set(seen)


# -- history ----------------------------------------------------------------------------


async def test_history_of_a_new_execution_is_its_pending_event(
    client: httpx.AsyncClient,
) -> None:
    body = await submit(client, ORDERS, "o-1")
    response = await client.get(f"/v1/executions/{body['id']}/history")
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["next_cursor"] is None
    assert len(page["items"]) == 1
    event = page["items"][0]
    assert set(event) == {"seq", "kind", "at", "data"}
    assert event["seq"] == 1
    assert event["kind"] == "pending"
    assert abs(parse_time(event["at"]) - parse_time(body["created_at"])) < timedelta(seconds=1)


async def test_history_pagination(client: httpx.AsyncClient, store: Store) -> None:
    body = await submit(client, MAIL, "a", "b")
    execution_id = uuid.UUID(body["id"])
    for round_ in range(2):
        claimed = await store.execution_claim(f"w{round_}", [MAIL], limit=1,
                                              lease_ttl=timedelta(minutes=5))
        assert [e.id for e in claimed] == [execution_id]
        claim = Claim(execution_id, f"w{round_}", claimed[0].lease_epoch)
        released = await store.execution_release_if_owned(claim, "test")
        assert released.applied
    full = (await client.get(f"/v1/executions/{execution_id}/history")).json()
    assert [e["kind"] for e in full["items"]] == [
        "pending", "running", "pending", "running", "pending"]
    assert [e["seq"] for e in full["items"]] == [1, 2, 3, 4, 5]
    assert full["next_cursor"] is None

    seen: list[dict[str, Any]] = []
    sizes: list[int] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor is not None:
            params["cursor"] = cursor
        response = await client.get(f"/v1/executions/{execution_id}/history", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        sizes.append(len(page["items"]))
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sizes == [2, 2, 1]
    assert seen == full["items"]
    # the largest limit the route documents is accepted (it once answered 422)
    response = await client.get(f"/v1/executions/{execution_id}/history",
                                params={"limit": 10_000})
    assert response.status_code == 200, response.text
    assert response.json() == full
    # a cursor past the end is an empty page, not an error
    response = await client.get(f"/v1/executions/{execution_id}/history",
                                params={"cursor": "5"})
    assert response.status_code == 200, response.text
    assert response.json() == {"items": [], "next_cursor": None}


# -- health and documentation ------------------------------------------------------------


async def test_healthz(client: httpx.AsyncClient, backend: str) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok", "database": "ok", "backend": backend}


async def test_openapi_lists_the_endpoints(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200, response.text
    paths = response.json()["paths"]
    assert {"get", "post"} <= set(paths["/v1/executions"])
    assert "get" in paths["/v1/executions/{execution_id}"]
    assert "get" in paths["/v1/executions/{execution_id}/history"]
    assert "get" in paths["/healthz"]
    post = paths["/v1/executions"]["post"]
    assert {"200", "201", "409", "413", "422"} <= set(post["responses"])


async def test_docs_page(client: httpx.AsyncClient) -> None:
    response = await client.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "openapi.json" in response.text


async def test_list_items_leave_out_large_values_with_their_size(
    client: httpx.AsyncClient, store: Store
) -> None:
    """A page's size is bounded in bytes, not only in items: params (and results, errors)
    larger than LIST_VALUE_BYTES are left out of list items, with their size; GET of the
    execution has them whole."""
    from veracity.api.schemas import LIST_VALUE_BYTES

    big = "x" * (LIST_VALUE_BYTES + 10)
    small = await submit(client, MAIL, "a", "b")
    large = await submit(client, MAIL, big, "b")
    items = {i["id"]: i for i in (await client.get("/v1/executions")).json()["items"]}
    assert items[small["id"]]["params"] == ["a", "b"]
    assert items[small["id"]]["elided"] is None
    assert items[large["id"]]["params"] is None
    size = len(json.dumps([big, "b"], separators=(",", ":")).encode())
    assert items[large["id"]]["elided"] == {"params": size}
    whole = (await client.get(f"/v1/executions/{large['id']}")).json()
    assert whole["params"] == [big, "b"] and whole["elided"] is None


async def test_retry_route(client: httpx.AsyncClient, store: Store) -> None:
    """PUT /v1/executions/{id}/retry: 201 and the new execution for a failed one; 409
    wrong_state for any other status, 404 for an unknown id, 400 for a bad one."""
    body = await submit(client, MAIL, "a", "b")
    execution_id = uuid.UUID(body["id"])
    response = await client.put(f"/v1/executions/{execution_id}/retry")
    assert response.status_code == 409, response.text
    assert response.json()["error"] | {"message": ""} == {
        "code": "wrong_state", "state": "pending", "message": ""}
    [claimed] = await store.execution_claim("w", [MAIL], limit=1,
                                            lease_ttl=timedelta(minutes=5))
    claim = Claim(execution_id, "w", claimed.lease_epoch)
    assert (await store.execution_fail_if_owned(claim, {"code": "boom"})).applied

    response = await client.put(f"/v1/executions/{execution_id}/retry")

    assert response.status_code == 201, response.text
    new = response.json()
    assert new["retry_of"] == str(execution_id) and new["status"] == "pending"
    assert new["params"] == ["a", "b"] and new["id"] != str(execution_id)
    assert (await client.get(f"/v1/executions/{execution_id}")).json()["status"] == "failed"
    assert (await client.put(f"/v1/executions/{uuid.uuid4()}/retry")).status_code == 404
    assert (await client.put("/v1/executions/nope/retry")).status_code == 400
