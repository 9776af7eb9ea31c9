"""The dashboard in-process (ASGI transport) over a real store, on both backends."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests._helpers import store_fixture
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.examples import shop
from veracity.models import Claim, Execution, NewExecution, ReconcileAction
from veracity.store import Store

DEPLOYMENT = "d-ui"
ORDERS = "shop:orders/process.run"
MAIL = "shop:mail/send.run"
MONITOR = "shop:monitor/stock.run-cancellable"
ORIGIN = "http://127.0.0.1:8000"

store = store_fixture()


@pytest.fixture
def service(store: Store) -> ExecutionService:
    return ExecutionService(store, workflows=set(shop.app.workflows),
                            deployment_id=DEPLOYMENT)


def client_for(api: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url=ORIGIN)


@pytest.fixture
async def client(service: ExecutionService) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_api(service)) as c:
        yield c


async def csrf(client: httpx.AsyncClient) -> str:
    """The browser's CSRF token: set by any page it loads."""
    if client.cookies.get("veracity_csrf") is None:
        await client.get("/ui/login")
    token = client.cookies.get("veracity_csrf")
    assert token
    return token


async def post(client: httpx.AsyncClient, path: str, data: dict[str, Any], *,
               headers: dict[str, str] | None = None, token: bool = True) -> httpx.Response:
    """A form post as the dashboard's own page sends it (same origin, CSRF field)."""
    form = dict(data)
    if token:
        form.setdefault("csrf", await csrf(client))
    return await client.post(path, data=form,
                             headers={"Origin": ORIGIN, **(headers or {})})


def text_of(html: str) -> str:
    """The page's text, tags removed and white space collapsed (what a person reads)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


async def submit(service: ExecutionService, ffqn: str = ORDERS, params: list[Any] | None = None,
                 **kw: Any) -> Execution:
    execution, _ = await service.submit(ffqn, params if params is not None else ["o", 1],
                                        **kw)
    return execution


async def child(store: Store, parent: Execution, ffqn: str = MAIL, join_set: str | None = None
                ) -> Execution:
    submitted = await store.execution_submit(NewExecution(
        ffqn=ffqn, params=["c"], deployment_id=DEPLOYMENT, id=uuid.uuid4(),
        parent_id=parent.id, join_set=join_set))
    return submitted.execution


async def claim(store: Store, ffqn: str) -> Claim:
    claimed = await store.execution_claim("w-1", [ffqn], limit=1,
                                          lease_ttl=timedelta(seconds=60),
                                          deployment_id=DEPLOYMENT)
    assert len(claimed) == 1
    e = claimed[0]
    assert e.lease_owner is not None
    return Claim(e.id, e.lease_owner, e.lease_epoch)


async def completed(service: ExecutionService, store: Store, result: Any,
                    params: list[Any] | None = None) -> Execution:
    e = await submit(service, MAIL, params)
    c = await claim(store, MAIL)
    assert c.execution_id == e.id
    assert (await store.execution_complete_if_owned(c, result)).applied
    return await service.get(e.id)


async def flagged(service: ExecutionService, store: Store,
                  reason: str = "the trigger's answer was lost",
                  data: dict[str, Any] | None = None) -> Execution:
    """A run delegated to the engine "n8n", without an external id, flagged."""
    e = await submit(service, MONITOR)
    c = await claim(store, MONITOR)
    assert c.execution_id == e.id
    assert (await store.execution_delegate_if_owned(c, "n8n", "x" * 64)).applied
    applied = await service.store.execution_reconcile_apply([ReconcileAction(
        e.id, None, WriteKind.FLAG, reason, data or {"engine": "n8n"},
        flag=FlagKind.NO_EXTERNAL_ID)])
    assert applied
    return await service.get(e.id)


async def failed(service: ExecutionService, store: Store) -> Execution:
    e = await submit(service, MAIL)
    c = await claim(store, MAIL)
    assert c.execution_id == e.id
    assert (await store.execution_fail_if_owned(c, {"message": "smtp down"})).applied
    return await service.get(e.id)
