"""Fixtures of the durable-engine tests: a fresh store per test on both backends, the
service and API over it (in-process), and a worker on ``tests.workflows:app``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from tests import workflows
from tests._helpers import store_fixture
from tests.durable._support import DEPLOYMENT, MAX_PAYLOAD, make_worker
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.store import Store
from veracity.worker.runner import Worker

store = store_fixture(pool_size=6)


@pytest.fixture
def worker(store: Store) -> Worker:
    """A worker on ``tests.workflows:app`` (not started: use ``running(worker)``)."""
    return make_worker(store, workflows.app)


@pytest.fixture
def service(store: Store, worker: Worker) -> ExecutionService:
    """The service over the same store; it knows the workflows of ``worker``'s App and
    wakes the worker on submissions, as the embedded server does."""
    return ExecutionService(
        store,
        workflows=set(worker.app.workflows),  # what the test's worker runs
        deployment_id=DEPLOYMENT,
        max_payload_bytes=MAX_PAYLOAD,
        on_submitted=worker.wake,
    )


@pytest.fixture
def api(service: ExecutionService) -> FastAPI:
    return create_api(service, max_payload_bytes=MAX_PAYLOAD)


@pytest.fixture
async def client(api: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    # raise_app_exceptions=False: a bug shows up as the 500 a real client would get
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c
