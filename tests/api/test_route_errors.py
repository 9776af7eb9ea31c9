"""Each error the OpenAPI document lists for a route (veracity.api.openapi.ROUTE_ERRORS) is
answered by a real request here, and every error these requests get is listed for their
route: the document lists what each route can answer, and only that. On both backends,
in-process, with executions in the states each error needs (a delegated run included)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
from fastapi import FastAPI

from tests.api.conftest import DEPLOYMENT, MAX_PAYLOAD
from veracity.api import create_api
from veracity.api.openapi import ROUTE_ERRORS, listed_errors
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.models import Claim, NewExecution, WorkerInfo
from veracity.runtime import shapes_of
from veracity.store import Store, token_hash

E = "/v1/executions/{execution_id}"
ADOPT = "/v1/deployments/{deployment_id}/adopt"
ORDERS = "shop:orders/process.run"
MONITOR = "shop:monitor/stock.run-cancellable"
UNKNOWN = "00000000-0000-4000-8000-000000000000"
CALLBACK = "the-callback-token"


@dataclass
class Seen:
    got: dict[tuple[str, str], set[tuple[int, str]]] = field(
        default_factory=lambda: defaultdict(set))
    unlisted: list[str] = field(default_factory=list)

    def add(self, method: str, route: str, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        code = response.json()["error"]["code"]
        self.got[(method, route)].add((response.status_code, code))
        listed = listed_errors(method, route).get(response.status_code, ())
        if code not in listed:
            self.unlisted.append(f"{method} {route}: {response.status_code} {code}")


async def delegated(store: Store) -> uuid.UUID:
    """A run delegated to the engine n8n, with its external id and callback token."""
    new = NewExecution(ffqn=ORDERS, params=["o", 1], deployment_id=DEPLOYMENT,
                       id=uuid.uuid4())
    await store.execution_submit(new)
    (claimed,) = await store.execution_claim("w-engine", [ORDERS], limit=1,
                                             lease_ttl=timedelta(seconds=60))
    claim = Claim(claimed.id, "w-engine", claimed.lease_epoch)
    assert (await store.execution_delegate_if_owned(claim, "n8n", token_hash(CALLBACK))
            ).applied
    await store.execution_record_external_id(claimed.id, "981")
    return claimed.id


async def test_every_listed_error_is_answered_and_every_answer_listed(
    api: FastAPI, client: httpx.AsyncClient, store: Store
) -> None:
    seen = Seen()

    async def call(method: str, route: str, url: str, **kw: Any) -> httpx.Response:
        response = await client.request(method, url, **kw)
        seen.add(method, route, response)
        return response

    async def submit(ffqn: str = ORDERS, **body: Any) -> str:
        response = await client.post("/v1/executions", json={
            "ffqn": ffqn, "params": ["o", 1] if ffqn == ORDERS else ["sku"], **body})
        assert response.status_code == 201, response.text
        ident: str = response.json()["id"]
        return ident

    engine = str(await delegated(store))  # first: it claims the one pending execution
    pending = await submit()
    cancelled = await submit(MONITOR)
    assert (await client.put(f"/v1/executions/{cancelled}/cancel")).status_code == 200
    paused = await submit(paused=True)
    big = "x" * (MAX_PAYLOAD + 1)

    # submit
    r = "/v1/executions"
    await call("POST", r, r, json={"ffqn": ORDERS, "params": ["o", 1],
                                  "idempotency_key": "k"})
    await call("POST", r, r, json={"ffqn": ORDERS, "params": ["o", 2],
                                  "idempotency_key": "k"})
    await call("POST", r, r, content=b"{nope")
    await call("POST", r, r, json={"ffqn": ORDERS, "extra": 1})
    await call("POST", r, r, json={"ffqn": "Not a name"})
    await call("POST", r, r, json={"ffqn": "x:y/z.w"})
    await call("POST", r, r, json={"ffqn": ORDERS, "scheduled_at": "1900-01-01T00:00:00Z"})
    await call("POST", r, r, content=b'{"ffqn": "shop:orders/process.run", "params": [NaN]}')
    await call("POST", r, r, json={"ffqn": ORDERS, "idempotency_key": "a\x00b"})
    await call("POST", r, r, json={"ffqn": ORDERS, "params": [big]})
    await call("POST", r, r, content=b"ffqn=x",
               headers={"content-type": "application/x-www-form-urlencoded"})
    # params checked against the workflow's signature, as a server does (its service knows
    # the app's workflows' parameters; this test's shared one does not)
    checking = create_api(ExecutionService(
        store, workflows=set(shop.app.workflows), deployment_id=DEPLOYMENT,
        max_payload_bytes=MAX_PAYLOAD, shapes=shapes_of(shop.app)),
        max_payload_bytes=MAX_PAYLOAD)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=checking),
                                 base_url="http://test") as strict:
        seen.add("POST", r, await strict.post(r, json={"ffqn": ORDERS,
                                                       "params": ["o", 1, 2, 3]}))
    # a batch
    b = "/v1/executions/batch"
    await call("POST", b, b, json={"items": [{"ffqn": ORDERS, "params": ["o", 1]}]})
    await call("POST", b, b, json={"items": [{"ffqn": ORDERS, "params": ["o", 3],
                                              "idempotency_key": "k"}]})
    await call("POST", b, b, json={"items": [{"ffqn": ORDERS, "params": [big]}]})
    await call("POST", b, b, content=b"items=x",
               headers={"content-type": "application/x-www-form-urlencoded"})
    await call("POST", b, b, content=b"{")
    await call("POST", b, b, json={"items": "x"})
    await call("POST", b, b, json={"items": [{"ffqn": "x:y/z.w"}]})
    # list
    await call("GET", r, r, params={"cursor": "garbage"})
    await call("GET", r, r, params={"limit": 0})
    await call("GET", r, r, params={"status": "bogus"})
    await call("GET", r, r, params={"created_after": "1900-01-01T00:00:00Z"})
    # one execution, its history
    for route, suffix, method in [(E, "", "GET"), (f"{E}/history", "/history", "GET"),
                                  (f"{E}/cancel", "/cancel", "PUT"),
                                  (f"{E}/retry", "/retry", "PUT"),
                                  (f"{E}/pause", "/pause", "PUT"),
                                  (f"{E}/unpause", "/unpause", "PUT")]:
        await call(method, route, f"/v1/executions/not-an-id{suffix}")
        await call(method, route, f"/v1/executions/{UNKNOWN}{suffix}")
    await call("GET", E, f"/v1/executions/{pending}", params={"wait": "61s"})
    await call("GET", f"{E}/history", f"/v1/executions/{pending}/history",
               params={"cursor": "x"})
    await call("GET", f"{E}/history", f"/v1/executions/{pending}/history", params={"limit": 0})
    await call("PUT", f"{E}/cancel", f"/v1/executions/{pending}/cancel")
    await call("PUT", f"{E}/retry", f"/v1/executions/{pending}/retry")
    await call("PUT", f"{E}/pause", f"/v1/executions/{cancelled}/pause")
    await call("PUT", f"{E}/pause", f"/v1/executions/{engine}/pause")
    p = f"/v1/executions/{pending}/pause"
    await call("PUT", f"{E}/pause", p, content=b"{")
    await call("PUT", f"{E}/pause", p, json={"why": "x"})
    await call("PUT", f"{E}/pause", p, json={"reason": " "})
    await call("PUT", f"{E}/pause", p, json={"reason": big})
    await call("PUT", f"{E}/pause", p, content=b"x", headers={"content-type": "text/plain"})
    await call("PUT", f"{E}/unpause", f"/v1/executions/{pending}/unpause")
    assert (await client.put(f"/v1/executions/{paused}/unpause")).status_code == 200
    # many at once
    c = "/v1/executions/cancel"
    await call("PUT", c, c, json={"ids": [pending, "not-an-id"]})
    await call("PUT", c, c, json={"ids": [UNKNOWN] * 1001})
    await call("PUT", c, c, json={"ids": []})
    await call("PUT", c, c, json={"ids": [pending], "by": " "})
    await call("PUT", c, c, content=b"{")
    await call("PUT", c, c, json={"ids": [pending], "who": "x"})
    await call("PUT", c, c, json={"ids": [pending], "by": big})
    await call("PUT", c, c, content=b"x", headers={"content-type": "text/plain"})
    # messages
    m = f"{E}/messages"
    for ident in ("not-an-id", UNKNOWN):
        await call("POST", m, f"/v1/executions/{ident}/messages", json={"topic": "t"})
    url = f"/v1/executions/{pending}/messages"
    await call("POST", m, f"/v1/executions/{cancelled}/messages", json={"topic": "t"})
    await call("POST", m, url, content=b"{")
    await call("POST", m, url, json={"topic": ""})
    await call("POST", m, url, json={"topic": "a\x00b"})
    await call("POST", m, url, content=b'{"topic": "t", "payload": NaN}')
    await call("POST", m, url, json={"topic": "t", "payload": big})
    await call("POST", m, url, content=b"x", headers={"content-type": "text/plain"})
    # the engine's callbacks
    for name in ("complete", "fail"):
        route = f"{E}/{name}"
        body = {"result": 1} if name == "complete" else {"error": "e"}
        auth = {"authorization": f"Bearer {CALLBACK}"}
        await call("POST", route, f"/v1/executions/not-an-id/{name}", json=body, headers=auth)
        await call("POST", route, f"/v1/executions/{UNKNOWN}/{name}", json=body, headers=auth)
        await call("POST", route, f"/v1/executions/{engine}/{name}", json=body)
        await call("POST", route, f"/v1/executions/{engine}/{name}", json=body,
                   headers={"authorization": "Bearer wrong"})
        await call("POST", route, f"/v1/executions/{engine}/{name}", content=b"[",
                   headers=auth)
        await call("POST", route, f"/v1/executions/{engine}/{name}", json={"other": 1},
                   headers=auth)
        field_ = "result" if name == "complete" else "error"
        await call("POST", route, f"/v1/executions/{engine}/{name}",
                   content=b'{"%s": [NaN]}' % field_.encode(), headers=auth)
        await call("POST", route, f"/v1/executions/{engine}/{name}",
                   json={"result": big, "error": big}, headers=auth)
        await call("POST", route, f"/v1/executions/{engine}/{name}", content=b"x",
                   headers={**auth, "content-type": "text/plain"})
    # resolve (before the run ends: the engine, not configured here, cannot confirm)
    rs = f"{E}/resolve"
    fail = {"action": "fail", "reason": "gone"}
    await call("PUT", rs, "/v1/executions/not-an-id/resolve", json=fail)
    await call("PUT", rs, f"/v1/executions/{UNKNOWN}/resolve", json=fail)
    await call("PUT", rs, f"/v1/executions/{engine}/resolve", json=fail)
    await call("PUT", rs, f"/v1/executions/{engine}/resolve", content=b"{")
    await call("PUT", rs, f"/v1/executions/{engine}/resolve", json={"action": "fail"})
    await call("PUT", rs, f"/v1/executions/{engine}/resolve",
               json={"action": "attach", "reason": "r"})
    await call("PUT", rs, f"/v1/executions/{pending}/resolve", json={**fail, "force": True})
    await call("PUT", rs, f"/v1/executions/{engine}/resolve", json={**fail, "reason": " "})
    await call("PUT", rs, f"/v1/executions/{engine}/resolve", json={**fail, "reason": big})
    await call("PUT", rs, f"/v1/executions/{engine}/resolve", content=b"x",
               headers={"content-type": "text/plain"})
    forced = await client.put(f"/v1/executions/{engine}/resolve", json={**fail, "force": True})
    assert forced.status_code == 200, forced.text
    await call("PUT", rs, f"/v1/executions/{cancelled}/resolve",
               json={"action": "attach", "external_execution_id": "1", "reason": "r"})
    await call("POST", f"{E}/complete", f"/v1/executions/{engine}/complete",
               json={"result": 1}, headers={"authorization": f"Bearer {CALLBACK}"})
    await call("POST", f"{E}/fail", f"/v1/executions/{engine}/fail",
               json={"error": 1}, headers={"authorization": f"Bearer {CALLBACK}"})
    # workers
    await call("GET", "/v1/workers", "/v1/workers", params={"limit": 0})
    # adopt: the server's deployment not recorded yet, then recorded
    await store.deployment_seen("d-old")
    await call("POST", ADOPT, "/v1/deployments/d-old/adopt")
    await store.deployment_seen(DEPLOYMENT)
    await call("POST", ADOPT, "/v1/deployments/d-none/adopt")
    await call("POST", ADOPT, f"/v1/deployments/{DEPLOYMENT}/adopt")
    await call("POST", ADOPT, "/v1/deployments/d-old/adopt", json={"ffqn_prefix": "Bad"})
    await call("POST", ADOPT, f"/v1/deployments/{'d' * 129}/adopt")
    await call("POST", ADOPT, "/v1/deployments/d-old/adopt", json={"by": ""})
    await call("POST", ADOPT, "/v1/deployments/d-old/adopt", content=b"{")
    await call("POST", ADOPT, "/v1/deployments/d-old/adopt", json={"by": big})
    await call("POST", ADOPT, "/v1/deployments/d-old/adopt", content=b"x",
               headers={"content-type": "text/plain"})
    await store.worker_register(WorkerInfo(id="w-old", host="h", pid=1, deployment_id="d-old",
                                           ffqns=[ORDERS], concurrency=1))
    await call("POST", ADOPT, "/v1/deployments/d-old/adopt")

    # a body nested deeper than the JSON parser goes, on every route that reads one
    deep = b'{"x": ' + b"[" * 1000 + b"]" * 1000 + b"}"  # under MAX_PAYLOAD
    auth = {"authorization": f"Bearer {CALLBACK}"}
    for method, route, where, headers in [
            ("POST", r, r, {}), ("POST", b, b, {}), ("PUT", c, c, {}),
            ("PUT", f"{E}/pause", p, {}), ("POST", m, url, {}),
            ("POST", f"{E}/complete", f"/v1/executions/{engine}/complete", auth),
            ("POST", f"{E}/fail", f"/v1/executions/{engine}/fail", auth),
            ("PUT", rs, f"/v1/executions/{engine}/resolve", {}),
            ("POST", ADOPT, "/v1/deployments/d-old/adopt", {})]:
        response = await call(method, route, where, content=deep, headers={
            **headers, "content-type": "application/json"})
        assert (response.status_code, response.json()["error"]["code"]) == (
            422, "invalid_json"), (method, where, response.text)

    assert not seen.unlisted, "answered but not listed:\n" + "\n".join(seen.unlisted)
    never = [f"{method} {route}: {status} {code}"
             for (method, route), errors in ROUTE_ERRORS.items()
             for status, codes in errors.items() for code in codes
             if (status, code) not in seen.got[(method, route)]]
    assert not never, "listed but never answered here:\n" + "\n".join(never)
