"""The HTTP API in-process (ASGI transport) over a real store, on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests._helpers import store_fixture
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.models import ExecutionFilter
from veracity.store import Store

MAX_PAYLOAD = 2048
DEPLOYMENT = "d-test"


store = store_fixture()


@pytest.fixture
def service(store: Store) -> ExecutionService:
    return ExecutionService(
        store,
        workflows=set(shop.app.workflows),
        deployment_id=DEPLOYMENT,
        max_payload_bytes=MAX_PAYLOAD,
    )


@pytest.fixture
def api(service: ExecutionService) -> FastAPI:
    return create_api(service, max_payload_bytes=MAX_PAYLOAD)


@pytest.fixture
async def client(api: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    # raise_app_exceptions=False: a bug must show up as the 500 a real client would get
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def count_executions(store: Store) -> int:
    return len(await store.execution_list(ExecutionFilter(), limit=100_000))


STABLE_FIELDS = (
    "id", "ffqn", "params", "status", "result", "error", "attempt", "deployment_id",
    "parent_id", "idempotency_key", "scheduled_at", "created_at", "updated_at",
    "lease_owner", "lease_epoch", "lease_expires_at",
)


def stable(execution: dict[str, Any]) -> dict[str, Any]:
    """The stored fields of an execution as the API shows it (derived, advisory fields such
    as a waiting reason may differ between two reads of one unchanged execution)."""
    return {key: execution[key] for key in STABLE_FIELDS}
