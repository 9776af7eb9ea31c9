"""Scoped API tokens on the HTTP API (docs/security.md), in-process over a real store: 401
for a missing, unknown, expired or revoked token; 403 naming the scope a route needs;
every route refuses a token without its scope (routes x scopes, from the one table in
veracity.api.auth); admin may do everything; the callbacks keep their own token; /healthz,
/metrics and the OpenAPI document stay open; and, when auth is not required, a request
without a token is served while one with a token is still checked."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from tests.api.conftest import DEPLOYMENT, MAX_PAYLOAD, count_executions
from tests.conftest import migrate
from tests.store._support import RawSQL, claim_exactly, new_execution
from veracity.api import create_api
from veracity.api.auth import ROUTE_ACCESS, Unscoped, check_routes
from veracity.clock import ManualClock
from veracity.control import ExecutionService, TokenService
from veracity.core.tokens import Scope, new_secret
from veracity.examples import shop
from veracity.models import Execution
from veracity.store import Store, open_store, token_hash

ORDERS = "shop:orders/process.run"
MONITOR = "shop:monitor/stock.run-cancellable"

SCOPED: dict[tuple[str, str], Scope] = {
    key: access for key, access in ROUTE_ACCESS.items()
    if isinstance(access, Scope) and key[1].startswith("/v1/")
}
"""The API's scoped routes; the dashboard's (under /ui) answer with pages, and
tests/ui/test_actions.py checks their scopes."""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_api(store: Store, *, required: bool = True) -> FastAPI:
    service = ExecutionService(store, workflows=set(shop.app.workflows),
                               deployment_id=DEPLOYMENT, max_payload_bytes=MAX_PAYLOAD)
    return create_api(service, max_payload_bytes=MAX_PAYLOAD, auth_required=required)


@pytest.fixture
async def secured(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    """The API with auth.required = true."""
    transport = httpx.ASGITransport(app=make_api(store), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


@pytest.fixture
async def relaxed(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    """The API with auth.required = false (a loopback bind's default)."""
    transport = httpx.ASGITransport(app=make_api(store, required=False),
                                    raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def token(store: Store, *scopes: Scope, name: str | None = None,
                expires: str | None = None) -> str:
    created = await TokenService(store).create(
        name or f"t-{uuid.uuid4().hex[:10]}", [s.value for s in scopes], expires)
    return created.token


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


# -- 401 ------------------------------------------------------------------------------------


async def test_no_token_is_401_and_nothing_is_written(
    secured: httpx.AsyncClient, store: Store
) -> None:
    response = await secured.post("/v1/executions", json={"ffqn": ORDERS, "params": ["o", 1]})
    error = refused(response, 401, "unauthorized")
    assert "Authorization: Bearer" in error["message"]
    assert "veracity token create" in error["message"]
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="veracity"'
    assert await count_executions(store) == 0
    refused(await secured.get("/v1/executions"), 401, "unauthorized")


@pytest.mark.parametrize("header", [
    "Bearer vrc_0123456789abcdef_" + "A" * 43,  # well formed, no such key id
    "Bearer garbage",
    "Bearer " + new_secret().token,
    "bearer " + new_secret().token,  # the scheme is case-insensitive (RFC 7235)
], ids=["unknown-key-id", "garbage", "new-token", "lowercase-scheme"])  # stable under xdist
async def test_an_unknown_token_is_401(secured: httpx.AsyncClient, store: Store,
                                       header: str) -> None:
    await token(store, Scope.ADMIN)  # a token exists, just not this one
    response = await secured.get("/v1/executions", headers={"Authorization": header})
    error = refused(response, 401, "unauthorized")
    assert error["message"] == "unknown API token"
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]


async def test_a_known_key_id_with_a_wrong_secret_is_401(
    secured: httpx.AsyncClient, store: Store
) -> None:
    good = await token(store, Scope.ADMIN, name="real")
    assert (await secured.get("/v1/executions", headers=bearer(good))).status_code == 200
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    error = refused(await secured.get("/v1/executions", headers=bearer(forged)),
                    401, "unauthorized")
    assert error["message"] == "unknown API token"  # nothing about the real token


async def test_a_basic_authorization_header_is_no_token(
    secured: httpx.AsyncClient, store: Store
) -> None:
    good = await token(store, Scope.ADMIN)
    response = await secured.get("/v1/executions", headers={"Authorization": f"Basic {good}"})
    refused(response, 401, "unauthorized")


async def test_an_expired_token_is_401(database_url: str) -> None:
    clock = ManualClock()
    store = await open_store(database_url, clock=clock)
    try:
        value = await token(store, Scope.EXECUTIONS_READ, name="short", expires="1h")
        transport = httpx.ASGITransport(app=make_api(store), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            clock.advance(timedelta(minutes=59))
            assert (await client.get("/v1/executions", headers=bearer(value))).status_code \
                == 200
            clock.advance(timedelta(minutes=1))
            error = refused(await client.get("/v1/executions", headers=bearer(value)),
                            401, "unauthorized")
            assert error["message"] == \
                "the API token 'short' expired at 2030-01-01T01:00:00Z"
    finally:
        await store.close()


async def test_a_revoked_token_is_401_at_once(secured: httpx.AsyncClient, store: Store
                                              ) -> None:
    value = await token(store, Scope.ADMIN, name="gone")
    assert (await secured.get("/v1/executions", headers=bearer(value))).status_code == 200
    revoked, changed = await TokenService(store).revoke("gone")
    assert changed and revoked.revoked_at is not None
    response = await secured.post("/v1/executions", json={"ffqn": ORDERS, "params": ["o", 1]},
                                  headers=bearer(value))
    error = refused(response, 401, "unauthorized")
    assert error["message"].startswith("the API token 'gone' was revoked at ")
    assert await count_executions(store) == 0


async def test_refused_before_the_body_is_read(secured: httpx.AsyncClient, store: Store
                                               ) -> None:
    """A request without a valid token learns nothing from its body: not malformed JSON
    (422), not its size (413)."""
    response = await secured.post("/v1/executions", content=b"{not json",
                                  headers={"content-type": "application/json"})
    refused(response, 401, "unauthorized")
    response = await secured.post("/v1/executions", content=b"x" * (MAX_PAYLOAD * 4),
                                  headers={"content-type": "application/json"})
    refused(response, 401, "unauthorized")
    reader = await token(store, Scope.EXECUTIONS_READ)
    response = await secured.post("/v1/executions", content=b"{not json",
                                  headers={"content-type": "application/json",
                                           **bearer(reader)})
    refused(response, 403, "forbidden")


# -- 403 ------------------------------------------------------------------------------------


async def test_a_token_without_the_scope_is_403_naming_it(
    secured: httpx.AsyncClient, store: Store
) -> None:
    reader = await token(store, Scope.EXECUTIONS_READ, Scope.EXECUTIONS_CANCEL, name="ro")
    response = await secured.post("/v1/executions", json={"ffqn": ORDERS, "params": ["o", 1]},
                                  headers=bearer(reader))
    error = refused(response, 403, "forbidden")
    assert error["scope"] == "executions:submit"
    assert error["message"] == (
        "the API token 'ro' lacks the scope executions:submit, which POST /v1/executions "
        "needs (it has: executions:read, executions:cancel)")
    assert response.headers["WWW-Authenticate"] == (
        'Bearer realm="veracity", error="insufficient_scope", scope="executions:submit"')
    assert await count_executions(store) == 0


async def test_the_token_records_its_last_use(secured: httpx.AsyncClient, store: Store
                                              ) -> None:
    value = await token(store, Scope.EXECUTIONS_READ, name="used")
    before = await store.token_get("used")
    assert before is not None and before.last_used_at is None
    assert (await secured.get("/v1/workers", headers=bearer(value))).status_code == 200
    after = await store.token_get("used")
    assert after is not None and after.last_used_at is not None
    assert after.last_used_at >= after.created_at


# -- every route x every scope ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    """A request to one route, and how the route answers it when the token may."""

    make: Callable[[ExecutionService], Awaitable[tuple[str, dict[str, Any] | None]]]
    allowed: int


async def _submitted(service: ExecutionService, ffqn: str = ORDERS, *,
                     paused: bool = False) -> Execution:
    execution, _ = await service.submit(ffqn, ["o", 1], paused=paused)
    return execution


def _on(suffix: str, ffqn: str = ORDERS, body: dict[str, Any] | None = None, *,
        paused: bool = False) -> Callable[[ExecutionService],
                                          Awaitable[tuple[str, dict[str, Any] | None]]]:
    async def make(service: ExecutionService) -> tuple[str, dict[str, Any] | None]:
        execution = await _submitted(service, ffqn, paused=paused)
        return f"/v1/executions/{execution.id}{suffix}", body
    return make


def _fixed(path: str, body: dict[str, Any] | None = None) -> Callable[
        [ExecutionService], Awaitable[tuple[str, dict[str, Any] | None]]]:
    async def make(service: ExecutionService) -> tuple[str, dict[str, Any] | None]:
        await _submitted(service)
        return path, body
    return make


EXECUTION = "/v1/executions/{execution_id}"
SAMPLES: dict[tuple[str, str], Sample] = {
    ("POST", "/v1/executions"): Sample(_fixed("/v1/executions",
                                              {"ffqn": ORDERS, "params": ["o", 2]}), 201),
    ("POST", "/v1/executions/batch"): Sample(_fixed(
        "/v1/executions/batch", {"items": [{"ffqn": ORDERS, "params": ["o", 2]}]}), 201),
    ("GET", "/v1/executions"): Sample(_fixed("/v1/executions"), 200),
    ("GET", EXECUTION): Sample(_on(""), 200),
    ("GET", f"{EXECUTION}/history"): Sample(_on("/history"), 200),
    ("GET", "/v1/workers"): Sample(_fixed("/v1/workers"), 200),
    ("GET", "/v1/crons"): Sample(_fixed("/v1/crons"), 200),
    ("GET", "/v1/deployments"): Sample(_fixed("/v1/deployments"), 200),
    # a deployment never recorded: the handler itself answers 404
    ("POST", "/v1/deployments/{deployment_id}/adopt"): Sample(
        _fixed("/v1/deployments/d-never-seen/adopt", {"by": "test"}), 404),
    # a pending execution has not failed: the handler itself answers 409
    ("PUT", f"{EXECUTION}/retry"): Sample(_on("/retry"), 409),
    ("PUT", f"{EXECUTION}/cancel"): Sample(_on("/cancel", MONITOR), 200),
    ("PUT", f"{EXECUTION}/pause"): Sample(_on("/pause"), 200),
    ("PUT", f"{EXECUTION}/unpause"): Sample(_on("/unpause", paused=True), 200),
    ("POST", f"{EXECUTION}/messages"): Sample(
        _on("/messages", body={"topic": "approval", "payload": {"ok": True}}), 201),
    # a pending execution is no delegated run: the handler itself answers 409
    ("PUT", f"{EXECUTION}/resolve"): Sample(
        _on("/resolve", body={"action": "cancel", "reason": "test"}), 409),
}


def test_every_scoped_route_has_a_sample_request() -> None:
    """Adding a route to ROUTE_ACCESS without a sample here fails, so that the matrix
    below covers it."""
    assert set(SAMPLES) == set(SCOPED)


def test_every_v1_route_of_the_app_has_a_scope_or_is_a_callback() -> None:
    api = create_api(auth_required=True)
    v1 = [(method, route.path) for route in api.routes if isinstance(route, APIRoute)
          for method in route.methods or () if route.path.startswith("/v1/")]
    assert v1, "no /v1 routes found"
    for key in v1:
        access = ROUTE_ACCESS[key]
        assert isinstance(access, Scope) or access is Unscoped.CALLBACK, key
        if key[0] == "GET":
            assert access is Scope.EXECUTIONS_READ, key
    callbacks = sorted(p for (_, p), a in ROUTE_ACCESS.items() if a is Unscoped.CALLBACK)
    assert callbacks == [f"{EXECUTION}/complete", f"{EXECUTION}/fail"]


def test_a_route_missing_from_the_table_stops_the_app_from_being_built() -> None:
    api = create_api()

    async def extra() -> None: ...

    routes = [*api.router.routes, APIRoute("/v1/extra", extra, methods=["DELETE"])]
    with pytest.raises(RuntimeError, match=r"DELETE /v1/extra"):
        check_routes(routes, ROUTE_ACCESS)
    table = dict(ROUTE_ACCESS)
    del table[("GET", "/v1/workers")]
    with pytest.raises(RuntimeError, match=r"without an entry.*GET /v1/workers"):
        check_routes(api.router.routes, table)
    table = {**ROUTE_ACCESS, ("GET", "/v1/gone"): Scope.EXECUTIONS_READ}
    with pytest.raises(RuntimeError, match=r"does not have: GET /v1/gone"):
        check_routes(api.router.routes, table)
    table = {**ROUTE_ACCESS, ("GET", "/v1/workers"): Unscoped.OPEN}
    with pytest.raises(RuntimeError, match=r"open: give it a scope"):
        check_routes(api.router.routes, table)
    table = {**ROUTE_ACCESS, ("GET", "/v1/workers"): Scope.ADMIN}
    with pytest.raises(RuntimeError, match=r"must need executions:read"):
        check_routes(api.router.routes, table)


@pytest.fixture(scope="module")
def matrix_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite database for the matrix (the decision does not depend on the backend;
    the store's part runs on both in tests/store/test_tokens.py)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('auth-matrix')}/veracity.db"
    migrate(url)
    return url


async def _answer(store: Store, route: tuple[str, str], scope: Scope) -> tuple[
        httpx.Response, Execution | None, Execution | None, int]:
    """Send the route's sample request with a token holding only ``scope``; the execution
    it names before and after, and how many executions there were before."""
    service = ExecutionService(store, workflows=set(shop.app.workflows),
                               deployment_id=DEPLOYMENT, max_payload_bytes=MAX_PAYLOAD)
    value = await token(store, scope)
    path, body = await SAMPLES[route].make(service)
    ident = (path.split("/")[3] if path.startswith("/v1/executions/")
             and path != "/v1/executions/batch" else None)
    before = await store.execution_get(uuid.UUID(ident)) if ident else None
    count = await count_executions(store)
    transport = httpx.ASGITransport(app=make_api(store), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.request(route[0], path, json=body, headers=bearer(value))
    after = await store.execution_get(uuid.UUID(ident)) if ident else None
    return response, before, after, count


@pytest.mark.parametrize("scope", list(Scope), ids=[s.value for s in Scope])
@pytest.mark.parametrize("route", list(SAMPLES), ids=[f"{m} {p}" for m, p in SAMPLES])
async def test_every_route_refuses_every_token_without_its_scope(
    matrix_db: str, route: tuple[str, str], scope: Scope
) -> None:
    needed = ROUTE_ACCESS[route]
    store = await open_store(matrix_db)
    try:
        response, before, after, count = await _answer(store, route, scope)
        if scope in (needed, Scope.ADMIN):
            assert response.status_code == SAMPLES[route].allowed, response.text
            return
        error = refused(response, 403, "forbidden")
        assert error["scope"] == needed.value
        assert needed.value in error["message"]
        # nothing written: the execution as it was, and no new one
        assert await count_executions(store) == count
        if before is not None:
            assert after is not None and stable_of(after) == stable_of(before)
            assert after.history_seq == before.history_seq
    finally:
        await store.close()


def stable_of(execution: Execution) -> dict[str, Any]:
    return {f.name: getattr(execution, f.name) for f in dataclasses.fields(execution)}


async def test_admin_alone_does_everything(secured: httpx.AsyncClient, store: Store) -> None:
    admin = bearer(await token(store, Scope.ADMIN))
    submitted = await secured.post("/v1/executions", headers=admin,
                                   json={"ffqn": MONITOR, "params": ["sku", 1]})
    assert submitted.status_code == 201, submitted.text
    ident = submitted.json()["id"]
    steps = [
        ("GET", f"/v1/executions/{ident}", None, 200),
        ("GET", "/v1/executions", None, 200),
        ("GET", f"/v1/executions/{ident}/history", None, 200),
        ("GET", "/v1/workers", None, 200),
        ("POST", f"/v1/executions/{ident}/messages", {"topic": "t", "payload": 1}, 201),
        ("PUT", f"/v1/executions/{ident}/pause", None, 200),
        ("PUT", f"/v1/executions/{ident}/unpause", None, 200),
        ("PUT", f"/v1/executions/{ident}/cancel", None, 200),
    ]
    for method, path, body, status in steps:
        response = await secured.request(method, path, json=body, headers=admin)
        assert response.status_code == status, (method, path, response.text)
    final = (await secured.get(f"/v1/executions/{ident}", headers=admin)).json()
    assert final["status"] == "cancelled"


async def test_an_operators_request_is_recorded_as_made_by_its_tokens_name(
    secured: httpx.AsyncClient, store: Store
) -> None:
    """Pause, unpause and cancel made with a token record the token's name as ``by`` (a
    pause's body may name someone else), and the waiting reason says who paused it."""
    ada = bearer(await token(store, Scope.ADMIN, name="ada-laptop"))
    submitted = await secured.post("/v1/executions", headers=ada,
                                   json={"ffqn": MONITOR, "params": ["sku", 1]})
    ident = submitted.json()["id"]
    for path, body in [("pause", {"reason": "look first"}), ("unpause", None),
                       ("pause", {"by": "bob"}), ("cancel", None)]:
        response = await secured.put(f"/v1/executions/{ident}/{path}", json=body, headers=ada)
        assert response.status_code == 200, response.text
        if response.json()["status"] == "paused":
            got = (await secured.get(f"/v1/executions/{ident}", headers=ada)).json()
            who = "bob" if body == {"by": "bob"} else "ada-laptop while pending: look first"
            assert got["waiting_reason"].startswith(f"paused by {who}"), got
    history = (await secured.get(f"/v1/executions/{ident}/history", headers=ada)).json()
    by = [(e["kind"], e["data"].get("by")) for e in history["items"]
          if e["kind"] in ("paused", "pending", "cancelled") and e["seq"] > 1]
    assert by == [("paused", "ada-laptop"), ("pending", "ada-laptop"), ("paused", "bob"),
                  ("cancelled", "ada-laptop")], history["items"]


# -- what stays as it was ---------------------------------------------------------------


async def _delegated(store: Store) -> tuple[Execution, str]:
    """A run delegated to an engine, and its callback token."""
    new = dataclasses.replace(new_execution(f"app.t{uuid.uuid4().hex[:12]}.run"))
    execution = (await store.execution_submit(new)).execution
    claim = await claim_exactly(store, execution.id)
    callback = f"cb-{uuid.uuid4().hex}"
    done = await store.execution_delegate_if_owned(claim, "n8n", token_hash(callback))
    assert done.applied
    return execution, callback


async def test_callbacks_keep_their_own_token(secured: httpx.AsyncClient, store: Store
                                              ) -> None:
    admin = await token(store, Scope.ADMIN)
    first, callback = await _delegated(store)
    # an API token is not the execution's callback token, not even admin's
    response = await secured.post(f"/v1/executions/{first.id}/complete",
                                  json={"result": 1}, headers=bearer(admin))
    refused(response, 401, "unauthorized")
    assert "callback token" in response.json()["error"]["message"]
    response = await secured.post(f"/v1/executions/{first.id}/complete",
                                  json={"result": 1}, headers=bearer(callback))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
    second, callback = await _delegated(store)
    response = await secured.post(f"/v1/executions/{second.id}/fail",
                                  json={"error": {"why": "x"}}, headers=bearer(callback))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "failed"


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/openapi.json", "/docs", "/redoc"])
@pytest.mark.parametrize("header", [None, "Bearer garbage"])
async def test_health_metrics_and_the_api_documents_stay_open(
    secured: httpx.AsyncClient, path: str, header: str | None
) -> None:
    headers = {"Authorization": header} if header else {}
    response = await secured.get(path, headers=headers)
    assert response.status_code == 200, response.text


async def test_unknown_routes_answer_404_without_a_token(secured: httpx.AsyncClient) -> None:
    refused(await secured.get("/v1/nothing-here"), 404, "not_found")
    refused(await secured.delete("/v1/executions"), 405, "method_not_allowed")


# -- auth not required ----------------------------------------------------------------


async def test_not_required_serves_requests_without_a_token(
    relaxed: httpx.AsyncClient, store: Store
) -> None:
    response = await relaxed.post("/v1/executions", json={"ffqn": ORDERS, "params": ["o", 1]})
    assert response.status_code == 201, response.text
    # a proxy's own scheme passes through untouched
    response = await relaxed.get("/v1/executions", headers={"Authorization": "Basic dTpw"})
    assert response.status_code == 200, response.text


async def test_not_required_still_checks_a_token_that_is_sent(
    relaxed: httpx.AsyncClient, store: Store
) -> None:
    reader = await token(store, Scope.EXECUTIONS_READ, name="reader")
    gone = await token(store, Scope.ADMIN, name="gone")
    await TokenService(store).revoke("gone")
    body = {"ffqn": ORDERS, "params": ["o", 1]}
    refused(await relaxed.post("/v1/executions", json=body, headers=bearer("vrc_wrong")),
            401, "unauthorized")
    refused(await relaxed.post("/v1/executions", json=body, headers=bearer(gone)),
            401, "unauthorized")
    error = refused(await relaxed.post("/v1/executions", json=body, headers=bearer(reader)),
                    403, "forbidden")
    assert error["scope"] == "executions:submit"
    assert await count_executions(store) == 0
    assert (await relaxed.get("/v1/executions", headers=bearer(reader))).status_code == 200


# -- the OpenAPI document ----------------------------------------------------------------


@pytest.mark.parametrize("required", [True, False])
async def test_openapi_declares_the_bearer_scheme_and_each_operations_scope(
    store: Store, required: bool
) -> None:
    transport = httpx.ASGITransport(app=make_api(store, required=required))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        schema = (await client.get("/openapi.json")).json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["apiToken"]["type"] == "http" and schemes["apiToken"]["scheme"] == "bearer"
    assert schemes["callbackToken"]["scheme"] == "bearer"
    for (method, path), scope in SCOPED.items():
        operation = schema["paths"][path][method.lower()]
        expected: list[dict[str, list[str]]] = [{"apiToken": [scope.value]}]
        if not required:
            expected.append({})  # optional: served without a token
        assert operation["security"] == expected, (method, path)
        assert f"`{scope.value}`" in operation["description"]
        assert {"401", "403"} <= set(operation["responses"])
    for callback in ("complete", "fail"):
        operation = schema["paths"][f"{EXECUTION}/{callback}"]["post"]
        assert operation["security"] == [{"callbackToken": []}]
    assert schema["paths"]["/healthz"]["get"]["security"] == []
    assert schema["paths"]["/metrics"]["get"]["security"] == []


async def test_the_database_keeps_the_digest_never_the_token(
    store: Store, database_url: str, secured: httpx.AsyncClient
) -> None:
    value = await token(store, Scope.ADMIN, name="secret-one")
    assert (await secured.get("/v1/executions", headers=bearer(value))).status_code == 200
    stored = await store.token_get("secret-one")
    assert stored is not None and stored.token_hash == token_hash(value)
    secret_part = value.split("_", 2)[2]
    rows = await store.token_list()
    assert all(secret_part not in repr(row) for row in rows)
    raw = RawSQL(database_url)
    columns = "name || key_id || token_hash || scopes"
    texts = [str(r[0]) for r in raw.execute(f"SELECT {columns} FROM veracity_api_tokens")]
    assert len(texts) == 1 and token_hash(value) in texts[0]
    assert secret_part not in texts[0]
    if database_url.startswith("sqlite:///"):  # the file itself, write-ahead log included
        path = database_url.removeprefix("sqlite:///")
        data = b"".join(Path(path + suffix).read_bytes() for suffix in ("", "-wal")
                        if Path(path + suffix).exists())
        assert secret_part.encode() not in data
        assert token_hash(value).encode() in data

