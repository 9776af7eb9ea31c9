"""A PostgreSQL outage, with a real server and a real worker under load (docs/operations.md):
every route answers ``503 database_unavailable`` within 5 s while the database is down;
once it accepts connections again, the server serves and the worker claims again within
3 s, whatever the outage's length; nothing submitted is lost, nothing is done twice.

The database is a private cluster that the test stops and starts, never the shared one.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests._cluster import private_cluster  # noqa: F401 - the fixture `cluster`
from tests._pg import TempCluster, free_port
from tests.worker._procs import Processes, WorkerProcess, veracity_bin, wait_until
from veracity.core.tokens import new_secret

pytestmark = pytest.mark.timeout(240)

RECOVERY_BOUND = 3.0
ANSWER_BOUND = 5.0
STEPS = "test:steps/run.fn"
ECHO = "test:echo/run.fn"


def requests_for_every_route(eid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """One valid request per route (valid bodies: the answer must come from trying the
    database, not from refusing the input)."""
    base = f"/v1/executions/{eid}"
    return [
        ("GET", "/v1/executions", None),
        ("POST", "/v1/executions", {"ffqn": ECHO, "params": [1]}),
        ("POST", "/v1/executions/batch", {"items": [{"ffqn": ECHO, "params": [2]}]}),
        ("GET", base, None),
        ("GET", f"{base}/history", None),
        ("PUT", f"{base}/cancel", None),
        ("PUT", "/v1/executions/cancel", {"ids": [eid]}),
        ("PUT", f"{base}/retry", None),
        ("PUT", f"{base}/pause", None),
        ("PUT", f"{base}/unpause", None),
        ("POST", f"{base}/messages", {"topic": "t", "payload": 1}),
        ("PUT", f"{base}/resolve", {"action": "fail", "reason": "r"}),
        ("POST", f"{base}/complete", {"result": 1}),
        ("POST", f"{base}/fail", {"error": "e"}),
        ("GET", "/v1/workers", None),
        ("GET", "/v1/crons", None),
        ("GET", "/v1/deployments", None),
        ("POST", "/v1/deployments/d-old/adopt", {"by": "ops"}),
        ("GET", "/healthz", None),
    ]


def openapi_routes(document: dict[str, Any]) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for path, methods in document["paths"].items():
        for method in methods:
            out.add((method.upper(), path))
    return out


def execution_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM veracity_executions").fetchone()
        assert row is not None
        return int(row[0])


def doubled(url: str) -> list[tuple[Any, ...]]:
    """Any execution with two terminal events, or a step position checkpointed twice."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            """
            SELECT execution_id, kind, data->>'pos', count(*) FROM veracity_history
            WHERE kind IN ('completed', 'failed', 'failed_transient', 'cancelled')
               OR kind = 'step_completed'
            GROUP BY execution_id, kind, data->>'pos' HAVING count(*) > 1
            """).fetchall()


async def outage(cluster: TempCluster, procs: Processes, tmp_path: Path,
                 seconds: float) -> None:
    url = cluster.url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
    port = free_port()
    # one cron entry (yearly, so it never fires here): the crons listing reads the database
    config = tmp_path / "veracity.toml"
    config.write_text(f'[[cron]]\nname = "yearly"\nffqn = "{ECHO}"\nschedule = "0 0 1 1 *"\n'
                      'params = [1]\n')
    procs.worker(url, "server", argv=[veracity_bin(), "server", "--no-worker"],
                 env={"VERACITY_PORT": str(port), "VERACITY_RECOVERY_INTERVAL": "1",
                      "VERACITY_CONFIG": str(config)})
    api = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=api, timeout=30) as client:
        async def healthy() -> bool:
            try:
                return (await client.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_until(healthy, 20, what="the server", describe=procs.describe)
        worker: WorkerProcess = procs.worker(url, "worker")

        async def submit(ffqn: str, params: list[Any]) -> str:
            response = await client.post("/v1/executions", json={"ffqn": ffqn,
                                                                  "params": params})
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        marks = str(tmp_path / "marks")
        before = [await submit(STEPS, [marks, 4, 0.05]) for _ in range(40)]
        await wait_until(lambda: worker.worker_id() is not None, 20, what="the worker",
                         describe=procs.describe)

        cluster.halt()
        down_at = time.monotonic()
        try:
            # every route says the database is unavailable, quickly
            routes = openapi_routes((await client.get("/openapi.json")).json())
            asked: set[tuple[str, str]] = set()

            async def ask(method: str, path: str, body: dict[str, Any] | None) -> None:
                started = time.monotonic()
                # a token (an API token, or a callback's) can only be checked against the
                # database: one shaped like a real token, so it is not refused on sight
                headers = {"Authorization": f"Bearer {new_secret().token}"}
                response = await client.request(method, path, json=body, headers=headers)
                took = time.monotonic() - started
                assert response.status_code == 503, (method, path, response.text)
                assert response.json()["error"]["code"] == "database_unavailable"
                assert response.headers["Retry-After"] == "1"
                assert took < ANSWER_BOUND, (method, path, took)
                asked.add((method, path.replace(before[0], "{execution_id}")
                                    .replace("/d-old/", "/{deployment_id}/")))

            await asyncio.gather(*(ask(*r) for r in requests_for_every_route(before[0])))
            v1 = {(m, p) for m, p in routes if p.startswith("/v1/") or p == "/healthz"}
            assert v1 <= asked, f"routes not checked during the outage: {v1 - asked}"
            # /metrics answers even without the database
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - down_at)))
        finally:
            cluster.resume()
        up_at = time.monotonic()  # pg_ctl -w start returns once it accepts connections

        await wait_until(healthy, RECOVERY_BOUND + 10, interval=0.05, what="serving again",
                         describe=procs.describe)
        served = time.monotonic() - up_at
        eid = await submit(ECHO, ["after"])

        async def completed() -> bool:
            got = (await client.get(f"/v1/executions/{eid}")).json()
            return bool(got["status"] == "completed")

        await wait_until(completed, RECOVERY_BOUND + 10, interval=0.05,
                         what="a claim after the outage", describe=procs.describe)
        claimed = time.monotonic() - up_at
        assert served <= RECOVERY_BOUND, f"served again {served:.2f} s after the database"
        assert claimed <= RECOVERY_BOUND, f"claimed again {claimed:.2f} s after the database"

        # nothing lost, nothing doubled: every execution submitted ends, once
        async def all_done() -> bool:
            for ident in before:
                got = (await client.get(f"/v1/executions/{ident}")).json()
                if got["status"] != "completed":
                    return False
            return True

        await wait_until(all_done, 30, what="every execution ended", describe=procs.describe)
        assert execution_count(url) == len(before) + 1
        assert doubled(url) == []


@pytest.mark.parametrize("seconds", [5, 60], ids=["5s", "60s"])
async def test_a_database_outage(cluster: TempCluster, procs: Processes, tmp_path: Path,
                                 seconds: float) -> None:
    await outage(cluster, procs, tmp_path, seconds)
