"""POST /v1/executions/batch and the check of params against the workflow's signature, on
both backends: one transaction per batch, idempotency keys inside one batch and across
batches, answers in order, and the bad input the issue lists (over 1,000 items or over the
payload limit: 413; valid and invalid items mixed: 422 naming each bad index), with
nothing written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.api.conftest import DEPLOYMENT, count_executions
from veracity.api import create_api
from veracity.app import App
from veracity.control import ExecutionService
from veracity.runtime import shapes_of
from veracity.store import Store
from veracity.worker.context import Context

PAYLOAD = 64 * 1024

app = App()


@app.workflow("t:sig/positional.run")
async def positional(ctx: Context, order_id: str, cents: int) -> None: ...


@app.workflow("t:sig/defaults.run")
async def defaults(ctx: Context, order_id: str, cents: int = 100) -> None: ...


@app.workflow("t:sig/star.run")
async def star(ctx: Context, first: str, *rest: int) -> None: ...


@app.workflow("t:sig/keyword.run")
async def keyword(ctx: Context, order_id: str, *, dry_run: bool = False) -> None: ...


@app.workflow("t:sig/keyword-required.run")
async def keyword_required(ctx: Context, order_id: str, *, region: str) -> None: ...


POSITIONAL, DEFAULTS, STAR = "t:sig/positional.run", "t:sig/defaults.run", "t:sig/star.run"
KEYWORD, KEYWORD_REQUIRED = "t:sig/keyword.run", "t:sig/keyword-required.run"


@pytest.fixture
def sig_api(store: Store) -> FastAPI:
    service = ExecutionService(store, workflows=set(app.workflows), deployment_id=DEPLOYMENT,
                               max_payload_bytes=PAYLOAD, shapes=shapes_of(app))
    return create_api(service, max_payload_bytes=PAYLOAD)


@pytest.fixture
async def http(sig_api: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=sig_api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


def item(ffqn: str = POSITIONAL, *params: Any, **extra: Any) -> dict[str, Any]:
    return {"ffqn": ffqn, "params": list(params) if params else ["o", 1], **extra}


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


# -- a batch ----------------------------------------------------------------------------


async def test_a_batch_answers_its_executions_in_order(
    http: httpx.AsyncClient, store: Store
) -> None:
    items = [item(POSITIONAL, f"o-{i}", i) for i in range(5)]
    items[2]["paused"] = True
    items[3]["scheduled_at"] = "2030-01-01T00:00:00Z"
    response = await http.post("/v1/executions/batch", json={"items": items})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["created"] == [True] * 5
    got = body["items"]
    assert [e["params"] for e in got] == [[f"o-{i}", i] for i in range(5)]
    assert [e["status"] for e in got] == ["pending", "pending", "paused", "pending", "pending"]
    assert got[3]["scheduled_at"].startswith("2030-01-01T00:00:00")
    assert all(e["deployment_id"] == DEPLOYMENT for e in got)
    for e in got:  # each answer is what is stored
        stored = (await http.get(f"/v1/executions/{e['id']}")).json()
        assert stored["id"] == e["id"] and stored["params"] == e["params"]
    assert await count_executions(store) == 5


async def test_idempotency_keys_inside_one_batch_and_across_batches(
    http: httpx.AsyncClient, store: Store
) -> None:
    first = await http.post("/v1/executions/batch", json={"items": [
        item(idempotency_key="a"), item(idempotency_key="b"), item(idempotency_key="a")]})
    assert first.status_code == 201, first.text
    ids = [e["id"] for e in first.json()["items"]]
    assert first.json()["created"] == [True, True, False]
    assert ids[0] == ids[2] and ids[0] != ids[1]

    again = await http.post("/v1/executions/batch", json={"items": [
        item(idempotency_key="b"), item(idempotency_key="a"), item(idempotency_key="c")]})
    assert again.status_code == 201, again.text
    assert again.json()["created"] == [False, False, True]
    assert [e["id"] for e in again.json()["items"]][:2] == [ids[1], ids[0]]

    # the same keys through the single route answer the same executions
    single = await http.post("/v1/executions", json=item(idempotency_key="a"))
    assert single.status_code == 200 and single.json()["id"] == ids[0]
    # a batch that creates nothing is answered 200
    none_new = await http.post("/v1/executions/batch",
                               json={"items": [item(idempotency_key="c")]})
    assert none_new.status_code == 200 and none_new.json()["created"] == [False]
    assert await count_executions(store) == 3


async def test_a_key_reused_for_another_request_refuses_the_batch_whole(
    http: httpx.AsyncClient, store: Store
) -> None:
    stored = (await http.post("/v1/executions", json=item(idempotency_key="k"))).json()
    response = await http.post("/v1/executions/batch", json={"items": [
        item(idempotency_key="new"), item(POSITIONAL, "other", 2, idempotency_key="k")]})
    error = error_of(response, 409, "idempotency_conflict")
    assert [(i["index"], i["execution_id"]) for i in error["items"]] == [(1, stored["id"])]
    assert await count_executions(store) == 1
    # inside one batch: the same key for two different requests
    response = await http.post("/v1/executions/batch", json={"items": [
        item(POSITIONAL, "x", 1, idempotency_key="z"),
        item(POSITIONAL, "y", 1, idempotency_key="z")]})
    # found before anything is written: the item names the one whose key it repeats
    # (no execution: none was made)
    assert error_of(response, 409, "idempotency_conflict")["items"] == [{
        "index": 1, "code": "idempotency_conflict", "first_index": 0,
        "message": "idempotency key 'z' is item 0's, given here for a different request"}]
    assert await count_executions(store) == 1
    assert (await http.post("/v1/executions", json=item(POSITIONAL, "y", 1,
                                                         idempotency_key="z"))
            ).status_code == 201  # the key is still free


# -- bad input: nothing written ------------------------------------------------------------


async def test_valid_and_invalid_items_mixed_are_refused_naming_each_bad_index(
    http: httpx.AsyncClient, store: Store
) -> None:
    items = [
        item(),                                   # 0 fine
        item("t:sig/unknown.run"),                # 1 unknown workflow
        item(POSITIONAL, "only-one"),             # 2 too few params
        {"ffqn": POSITIONAL, "params": "oops"},   # 3 not a list
        item(idempotency_key=""),                 # 4 an empty key
        item(),                                   # 5 fine
        item(scheduled_at="yesterday"),           # 6 not a time
        {"ffqn": POSITIONAL, "extra": 1},         # 7 an unknown field
        "not an object",                          # 8
        item("no-colon"),                         # 9 not a workflow name
    ]
    response = await http.post("/v1/executions/batch", json={"items": items})
    error = error_of(response, 422, "invalid_batch")
    bad = {i["index"]: i["code"] for i in error["items"]}
    assert bad == {1: "unknown_workflow", 2: "invalid_params", 3: "invalid_params",
                   4: "invalid_input", 6: "invalid_input", 7: "invalid_input",
                   8: "invalid_input", 9: "invalid_ffqn"}
    assert "1, 2, 3, 4, 6, 7, 8, 9" in error["message"]
    assert all(i["message"] for i in error["items"])
    assert await count_executions(store) == 0


async def test_over_a_thousand_items_is_413(http: httpx.AsyncClient, store: Store) -> None:
    small = {"ffqn": POSITIONAL, "params": ["o", 1]}
    response = await http.post("/v1/executions/batch", json={"items": [small] * 1001})
    error = error_of(response, 413, "payload_too_large")
    assert "1,000" in error["message"] and "1,001" in error["message"]
    assert await count_executions(store) == 0
    # exactly 1,000 is taken
    response = await http.post("/v1/executions/batch", json={"items": [small] * 1000})
    assert response.status_code == 201, response.text
    assert len(response.json()["items"]) == 1000
    assert await count_executions(store) == 1000


async def test_a_body_over_the_payload_limit_is_413(
    http: httpx.AsyncClient, store: Store
) -> None:
    big = [item(POSITIONAL, "x" * 1000, i) for i in range(100)]  # ~100 KB > 64 KiB
    response = await http.post("/v1/executions/batch", json={"items": big})
    error_of(response, 413, "payload_too_large")
    assert await count_executions(store) == 0


@pytest.mark.parametrize("body", [
    {}, {"items": "no"}, {"items": [item()], "more": 1}, [item()],
], ids=["no-items", "items-not-a-list", "unknown-field", "a-bare-list"])
async def test_a_malformed_batch_body_is_422(
    http: httpx.AsyncClient, store: Store, body: Any
) -> None:
    response = await http.post("/v1/executions/batch", json=body)
    error_of(response, 422, "invalid_input")
    assert await count_executions(store) == 0


async def test_an_empty_batch_answers_nothing(http: httpx.AsyncClient, store: Store) -> None:
    response = await http.post("/v1/executions/batch", json={"items": []})
    assert response.status_code == 200, response.text
    assert response.json() == {"items": [], "created": []}
    assert await count_executions(store) == 0


# -- params against the signature, single and batch -----------------------------------------


@pytest.mark.parametrize(("ffqn", "params"), [
    (POSITIONAL, ["o", 1]),
    (DEFAULTS, ["o"]), (DEFAULTS, ["o", 5]),
    (STAR, ["a"]), (STAR, ["a", 1, 2, 3]),
    (KEYWORD, ["o"]),
], ids=str)
async def test_params_that_fit_the_signature_are_taken(
    http: httpx.AsyncClient, ffqn: str, params: list[Any]
) -> None:
    response = await http.post("/v1/executions", json={"ffqn": ffqn, "params": params})
    assert response.status_code == 201, response.text
    response = await http.post("/v1/executions/batch",
                               json={"items": [{"ffqn": ffqn, "params": params}]})
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(("ffqn", "params", "words"), [
    (POSITIONAL, ["o"], "missing cents"),
    (POSITIONAL, ["o", 1, 2], "got 3"),
    (POSITIONAL, [], "missing order_id, cents"),
    (DEFAULTS, [], "missing order_id"),
    (DEFAULTS, ["o", 1, 2], "1 to 2"),
    (STAR, [], "at least 1"),
    (KEYWORD, ["o", True], "exactly 1"),
    (KEYWORD_REQUIRED, ["o"], "region"),
], ids=str)
async def test_params_that_do_not_fit_are_422_invalid_params_at_submit(
    http: httpx.AsyncClient, store: Store, ffqn: str, params: list[Any], words: str
) -> None:
    response = await http.post("/v1/executions", json={"ffqn": ffqn, "params": params})
    error = error_of(response, 422, "invalid_params")
    assert words in error["message"] and ffqn in error["message"]
    response = await http.post("/v1/executions/batch", json={"items": [
        item(), {"ffqn": ffqn, "params": params}]})
    error = error_of(response, 422, "invalid_batch")
    assert [(i["index"], i["code"]) for i in error["items"]] == [(1, "invalid_params")]
    assert words in error["items"][0]["message"]
    assert await count_executions(store) == 0
