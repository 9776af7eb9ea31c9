"""Apps made by ``create_api`` share one set of routes per process (api/app.py
``_api_routes``, ui/routes.py ``_dashboard_routes``); what differs between them lives on
each app's state. Two apps in one process, made differently, each answer as made."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter

from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.store import Store


def serve(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.fixture
def services(store: Store) -> list[ExecutionService]:
    return [ExecutionService(store, workflows=set(shop.app.workflows), deployment_id=d)
            for d in ("d-one", "d-two")]


@pytest.fixture
async def two(services: list[ExecutionService]) -> AsyncIterator[list[httpx.AsyncClient]]:
    registries = [CollectorRegistry(), CollectorRegistry()]
    for name, registry in zip(("first_app", "second_app"), registries, strict=True):
        Counter(name, "which app this is", registry=registry).inc()
    apps = [create_api(services[0], registry=registries[0], auth_required=True),
            create_api(services[1], registry=registries[1], auth_required=False)]
    assert apps[0].router.routes[-1] is apps[1].router.routes[-1]  # shared, not rebuilt
    async with serve(apps[0]) as one, serve(apps[1]) as other:
        yield [one, other]


async def test_each_app_answers_with_its_own_service_metrics_and_auth(
    two: list[httpx.AsyncClient],
) -> None:
    one, other = two
    # the submission is recorded with the deployment of the app's own service
    created = await other.post("/v1/executions", json={"ffqn": "shop:orders/process.run",
                                                        "params": ["o-1"]})
    assert created.status_code == 201, created.text
    assert created.json()["deployment_id"] == "d-two"
    # auth required on one app only: a token is needed there, not on the other
    refused = await one.get("/v1/executions")
    assert refused.status_code == 401, refused.text
    assert (await other.get("/v1/executions")).status_code == 200
    page = await one.get("/ui/executions")
    assert page.status_code == 303 and page.headers["location"].startswith("/ui/login")
    assert (await other.get("/ui/executions")).status_code == 200
    # each app's /metrics is its own registry
    first = (await one.get("/metrics")).text
    second = (await other.get("/metrics")).text
    assert "first_app_total 1.0" in first and "second_app" not in first
    assert "second_app_total 1.0" in second and "first_app" not in second
