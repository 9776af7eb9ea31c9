"""``GET /healthz`` when the database does not answer: ``503`` with the JSON error body,
within the health check's own timeout (not the connection pool's 30 s), and ``200`` again
once the database is back.

PostgreSQL only: the check is ``SELECT 1`` on the store's connection, which no change to an
SQLite file can make fail (an open SQLite connection keeps its file), whereas a PostgreSQL
database can stop answering under a running server. Here the test's database refuses new
connections (``ALLOW_CONNECTIONS false``) and the store's open ones are terminated, as
when the database is restarted or taken offline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg import sql

from tests._helpers import pg_store_fixture
from tests.api.conftest import DEPLOYMENT
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.store import Store

HEALTH_TIMEOUT = 1.0


pg_store = pg_store_fixture()


@pytest.fixture
async def pg_client(pg_store: Store) -> AsyncIterator[httpx.AsyncClient]:
    service = ExecutionService(pg_store, workflows=set(shop.app.workflows),
                               deployment_id=DEPLOYMENT)
    api = create_api(service, health_timeout=HEALTH_TIMEOUT)
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


class Outage:
    """Take the test's database offline and back, from the server's maintenance database."""

    def __init__(self, server_url: str, database_url: str) -> None:
        self.server_url = server_url
        self.name = urlsplit(database_url).path.lstrip("/")

    def _admin(self, statement: sql.Composed) -> None:
        with psycopg.connect(self.server_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)

    def begin(self) -> None:
        db = sql.Identifier(self.name)
        self._admin(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(db))
        # wait (up to 5 s each) until the terminated backends have exited
        self._admin(sql.SQL(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = {} AND pid <> pg_backend_pid()").format(sql.Literal(self.name)))

    def end(self) -> None:
        db = sql.Identifier(self.name)
        self._admin(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(db))


@pytest.fixture
def outage(pg_server_url: str, pg_url: str) -> Iterator[Outage]:
    o = Outage(pg_server_url, pg_url)
    try:
        yield o
    finally:
        o.end()


async def test_healthz_is_503_while_the_database_does_not_answer(
    pg_client: httpx.AsyncClient, outage: Outage
) -> None:
    response = await pg_client.get("/healthz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok", "database": "ok", "backend": "postgresql"}

    outage.begin()
    for _ in range(2):  # the first check finds dead connections, the next finds none
        started = time.monotonic()
        response = await pg_client.get("/healthz")
        elapsed = time.monotonic() - started
        assert response.status_code == 503, response.text
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"code", "message"}, body
        assert body["error"]["code"] == "database_unavailable"
        assert body["error"]["message"].startswith("database check failed"), body
        assert "Traceback" not in response.text
        assert elapsed < HEALTH_TIMEOUT + 2, elapsed

    outage.end()
    deadline = time.monotonic() + 8  # the pool reconnects with a backoff of 1 s, 2 s, ...
    while (response := await pg_client.get("/healthz")).status_code != 200:
        assert response.status_code == 503, response.text
        assert time.monotonic() < deadline, "healthz did not recover: " + response.text
        await asyncio.sleep(0.05)
    assert response.json() == {"status": "ok", "database": "ok", "backend": "postgresql"}


async def test_a_request_looks_up_no_opentelemetry_provider(
        client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """FastAPI's own OpenTelemetry instrumentation is off (veracity/api/app.py): a request
    does not look up OpenTelemetry's providers, which, left on, FastAPI did on every
    request (some 3 % of the server's CPU a submission; docs/scaling.md)."""
    otel_metrics = pytest.importorskip("opentelemetry.metrics",
                                       reason="FastAPI without OpenTelemetry")
    otel_trace = pytest.importorskip("opentelemetry.trace")
    looked_up: list[str] = []

    def counted(name: str, real: Any) -> Any:
        def lookup() -> Any:
            looked_up.append(name)
            return real()
        return lookup

    for module, name in ((otel_metrics, "get_meter_provider"),
                         (otel_trace, "get_tracer_provider")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    answer = await client.post("/v1/executions",
                               json={"ffqn": "shop:orders/process.run", "params": ["o", 1]})
    assert answer.status_code == 201
    assert (await client.get("/healthz")).status_code == 200
    assert looked_up == []
