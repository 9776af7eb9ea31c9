"""The metrics an operator alerts on (veracity.telemetry, docs/operations.md "Metrics"):
counted where things happen, on both backends, read back from ``/metrics`` as Prometheus
would; a ``veracity worker`` process serves its own on ``--metrics-port``; the docs list
exactly the metrics a server and a worker serve."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._helpers import store_fixture, until, wait_status
from tests._pg import free_port
from veracity import App, Context, RetryPolicy
from veracity.api import create_api
from veracity.config import WorkerSettings
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.models import Claim, Execution, NewExecution
from veracity.store import Store
from veracity.telemetry import Telemetry
from veracity.worker.runner import Worker

REPO = Path(__file__).resolve().parents[1]
DEPLOYMENT = "d-telemetry"
SETTINGS = WorkerSettings(lease_ttl=5, heartbeat_interval=1, poll_interval=0.05,
                          concurrency=4, shutdown_grace=1)

app = App("telemetry-tests")
FLAKY: dict[str, int] = {}


def _double(n: int) -> int:
    return 2 * n


def _flaky(key: str) -> str:
    FLAKY[key] = FLAKY.get(key, 0) + 1
    if FLAKY[key] == 1:
        raise RuntimeError("the first try fails")
    return "second try"


def _never(_: str) -> None:
    raise ValueError("always")


@app.workflow("tel:ok/run.fn")
async def ok(ctx: Context, n: int) -> int:
    doubled: int = await ctx.step(_double, n)
    return doubled


@app.workflow("tel:flaky/run.fn")
async def flaky(ctx: Context, key: str) -> str:
    return str(await ctx.step_with(_flaky, key, retry=RetryPolicy(initial_delay=0.01)))


@app.workflow("tel:fails/run.fn")
async def fails(ctx: Context) -> None:
    await ctx.step_with(_never, "x", retry=RetryPolicy(max_attempts=1))


@app.workflow("tel:later/run.fn-cancellable")
async def later(ctx: Context) -> None:
    return None


store = store_fixture()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics answer, by name and sorted labels."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


class Rig:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.telemetry = Telemetry()
        self.service = ExecutionService(store, workflows=set(app.workflows),
                                        deployment_id=DEPLOYMENT)
        self.service.telemetry = self.telemetry
        self.api = create_api(self.service, telemetry=self.telemetry)
        self.worker = Worker(store, app, settings=SETTINGS, deployment_id=DEPLOYMENT,
                             telemetry=self.telemetry)

    async def metrics(self, client: httpx.AsyncClient) -> dict[Any, float]:
        answer = await client.get("/metrics")
        assert answer.status_code == 200
        return samples(answer.text)


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[Rig]:
    FLAKY.clear()
    yield Rig(store)


@pytest.fixture
async def client(rig: Rig) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=rig.api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def submit(client: httpx.AsyncClient, ffqn: str, *params: Any, **body: Any) -> str:
    answer = await client.post("/v1/executions", json={"ffqn": ffqn, "params": list(params),
                                                       **body})
    assert answer.status_code in (200, 201), answer.text
    return str(answer.json()["id"])


async def test_what_a_server_and_its_worker_did_is_on_metrics(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    later_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    waiting = await submit(client, "tel:later/run.fn-cancellable", scheduled_at=later_at)
    before = await rig.metrics(client)
    # the gauge is read from the database at the scrape: one pending, nothing else
    assert value(before, "veracity_executions", status="pending") == 1
    assert value(before, "veracity_executions", status="running") == 0
    # only the unfinished statuses have a series: an ended one's would read 0 however many
    # the table holds (the scrape counts the unfinished alone)
    assert sorted(dict(k[1])["status"] for k in before
                  if k[0] == "veracity_executions") == [
        "blocked", "paused", "pending", "running"]

    ids = [await submit(client, "tel:ok/run.fn", 21, idempotency_key="k-ok"),
           await submit(client, "tel:flaky/run.fn", "a"),
           await submit(client, "tel:fails/run.fn")]
    assert await submit(client, "tel:ok/run.fn", 21, idempotency_key="k-ok") == ids[0]
    cancelled = await client.put(f"/v1/executions/{waiting}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    missing = await client.get(f"/v1/executions/{uuid.uuid4()}")
    assert missing.status_code == 404
    assert (await client.get("/no/such/route")).status_code == 404

    task = asyncio.create_task(rig.worker.run())
    try:
        for eid, status in zip(ids, (Status.COMPLETED, Status.COMPLETED, Status.FAILED),
                               strict=True):
            await wait_status(rig.store, uuid.UUID(eid), status)
    finally:
        rig.worker.stop()
        await task
    found = await rig.metrics(client)

    assert value(found, "veracity_submissions_total", ffqn="tel:ok/run.fn",
                 outcome="created") == 1
    assert value(found, "veracity_submissions_total", ffqn="tel:ok/run.fn",
                 outcome="existing") == 1
    assert value(found, "veracity_submissions_total", ffqn="tel:flaky/run.fn",
                 outcome="created") == 1
    ended = {(dict(k[1])["ffqn"], dict(k[1])["status"]): v for k, v in found.items()
             if k[0] == "veracity_executions_ended_total"}
    assert ended == {("tel:ok/run.fn", "completed"): 1, ("tel:flaky/run.fn", "completed"): 1,
                     ("tel:fails/run.fn", "failed"): 1,
                     ("tel:later/run.fn-cancellable", "cancelled"): 1}
    assert value(found, "veracity_steps_total", ffqn="tel:ok/run.fn",
                 outcome="completed") == 1
    assert value(found, "veracity_steps_total", ffqn="tel:flaky/run.fn",
                 outcome="completed") == 1
    assert value(found, "veracity_steps_total", ffqn="tel:fails/run.fn", outcome="failed") == 1
    assert value(found, "veracity_step_retries_total", ffqn="tel:flaky/run.fn") == 1
    assert value(found, "veracity_step_retries_total", ffqn="tel:ok/run.fn") == 0
    # three executions started: claimed, in claims that took one or more each, or (on
    # PostgreSQL) handed to the idle worker at submission
    handed = value(found, "veracity_handoffs_total")
    assert value(found, "veracity_claim_batch_size_sum") + handed == 3
    assert handed == 0 or rig.store.backend == "postgresql"
    assert value(found, "veracity_claim_batch_size_count") <= 3
    # each of the three started once; the cancelled one never started, so never "ran"
    assert value(found, "veracity_execution_queue_seconds_count") == 3
    assert value(found, "veracity_execution_run_seconds_count") == 3
    assert value(found, "veracity_execution_run_seconds_sum") >= 0
    # nothing left unfinished, as the database says
    assert value(found, "veracity_executions", status="pending") == 0
    # requests by route template (never the raw path), method and status
    assert value(found, "veracity_http_requests_total", method="POST",
                 route="/v1/executions", status="201") == 4
    assert value(found, "veracity_http_requests_total", method="POST",
                 route="/v1/executions", status="200") == 1
    assert value(found, "veracity_http_requests_total", method="PUT",
                 route="/v1/executions/{execution_id}/cancel", status="200") == 1
    assert value(found, "veracity_http_requests_total", method="GET",
                 route="/v1/executions/{execution_id}", status="404") == 1
    assert value(found, "veracity_http_requests_total", method="GET", route="unmatched",
                 status="404") == 1
    assert value(found, "veracity_http_request_duration_seconds_count", method="POST",
                 route="/v1/executions") == 5
    # the five single submissions came one after the other: five writes of one each
    assert value(found, "veracity_submission_write_size_count") == 5
    assert value(found, "veracity_submission_write_size_sum") == 5
    assert not any(waiting in str(k) for k in found), "an id became a label"


async def test_single_submissions_that_arrive_together_show_as_shared_writes(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    await asyncio.gather(*(submit(client, "tel:ok/run.fn", i) for i in range(10)))
    found = await rig.metrics(client)
    # every submission is in one write; fewer writes than submissions: some were shared
    assert value(found, "veracity_submission_write_size_sum") == 10
    assert value(found, "veracity_submission_write_size_count") < 10
    assert rig.service.groups.groups >= 1


async def test_a_refused_exit_is_a_late_report(rig: Rig) -> None:
    """A worker whose lease was lost reports its completion: refused, kept as a late report
    in the history, and counted."""
    eid = uuid.uuid4()
    await rig.store.execution_submit(NewExecution(ffqn="tel:ok/run.fn", params=[1],
                                                  deployment_id=DEPLOYMENT, id=eid))
    owner = rig.worker.id
    (claimed,) = await rig.store.execution_claim(owner, ["tel:ok/run.fn"], limit=1,
                                                 lease_ttl=timedelta(seconds=30))
    stale = Claim(eid, owner, claimed.lease_epoch - 1)  # an older epoch: fenced out
    await rig.worker._complete(stale, 2)
    assert rig.telemetry.registry.get_sample_value(
        "veracity_late_reports_total", {"source": "worker"}) == 1
    assert rig.telemetry.registry.get_sample_value(
        "veracity_executions_ended_total",
        {"ffqn": "tel:ok/run.fn", "status": "completed"}) is None
    kinds = [e.kind for e in await rig.store.history_list(eid)]
    assert kinds[-1] == "late_report"


def test_a_first_claim_alone_counts_its_time_in_the_queue() -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    s = timedelta(seconds=1)
    base = Execution(id=uuid.uuid4(), ffqn="a:b/c.d", params=[], status=Status.RUNNING,
                     result=None, error=None, attempt=1, deployment_id="d", parent_id=None,
                     idempotency_key=None, scheduled_at=t0, created_at=t0, updated_at=t0,
                     lease_owner="w", lease_epoch=1, lease_expires_at=None)
    telemetry = Telemetry()
    # scheduled after its submission: the wait counts from the scheduled time
    telemetry.started(replace(base, scheduled_at=t0 + 5 * s, updated_at=t0 + 7 * s,
                              started_at=t0 + 7 * s))
    # claimed again later (after a sleep): not a start
    telemetry.started(replace(base, updated_at=t0 + 60 * s, started_at=t0 + s))
    get = telemetry.registry.get_sample_value
    assert get("veracity_execution_queue_seconds_count", {}) == 1
    assert get("veracity_execution_queue_seconds_sum", {}) == 2
    # a transition that ends nothing is not counted; one that does counts its run time
    telemetry.end(replace(base, status=Status.BLOCKED, started_at=t0))
    telemetry.end(replace(base, status=Status.COMPLETED, updated_at=t0 + 90 * s,
                          started_at=t0 + 30 * s))
    assert get("veracity_executions_ended_total", {"ffqn": "a:b/c.d",
                                                   "status": "completed"}) == 1
    assert get("veracity_execution_run_seconds_sum", {}) == 60


DOCUMENTED = re.compile(r"^\| `(veracity_[a-z_]+)`", re.MULTILINE)


def documented_metrics() -> set[str]:
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("## Metrics", 1)[1]
    # a counter's family is its name without _total, as the parser names it
    return {name.removesuffix("_total") for name in DOCUMENTED.findall(section)}


def served_families(text: str) -> set[str]:
    # a counter's or histogram's *_created series (its start time) is no metric of its own
    return {family.name for family in text_string_to_metric_families(text)
            if not family.name.startswith(("python_", "process_"))
            and not family.name.endswith("_created")}


async def test_a_worker_process_serves_its_metrics(procs: Any, sqlite_url: str) -> None:
    """``veracity worker --metrics-port``: the counts of what that process did."""
    from tests.worker._procs import veracity_bin
    from veracity.store import open_store

    database_url = sqlite_url
    port = free_port()
    procs.worker(database_url, "w1",
                 argv=[veracity_bin(), "worker", "--metrics-port", str(port)])
    db = await open_store(database_url)
    try:
        eid = uuid.uuid4()
        await db.execution_submit(NewExecution(ffqn="test:echo/run.fn", params=["hi"],
                                               deployment_id="d-test", id=eid))
        await wait_status(db, eid, Status.COMPLETED, timeout=20)
    finally:
        await db.close()

    async def scrape() -> str | None:
        try:
            async with httpx.AsyncClient() as c:
                answer = await c.get(f"http://127.0.0.1:{port}/metrics")
        except httpx.HTTPError:
            return None
        return answer.text if "veracity_executions_ended_total{" in answer.text else None

    text = await until(scrape, timeout=10, what="the worker's metrics")
    found = samples(text)
    assert value(found, "veracity_executions_ended_total", ffqn="test:echo/run.fn",
                 status="completed") == 1
    assert value(found, "veracity_claim_batch_size_sum") == 1
    # what a worker serves is documented, and the docs name nothing else
    assert served_families(text) <= documented_metrics()


async def test_the_docs_list_every_metric_a_server_serves(rig: Rig,
                                                          client: httpx.AsyncClient) -> None:
    from prometheus_client import CollectorRegistry

    from veracity.control import ServiceMetrics
    from veracity.maintenance.cron import CronMetrics
    from veracity.maintenance.reconciler import ReconcilerMetrics
    from veracity.maintenance.recovery import RecoveryMetrics
    from veracity.maintenance.retention import RetentionMetrics

    # the server registers all of these in one registry (veracity.server)
    registry = rig.telemetry.registry
    ServiceMetrics(registry), RecoveryMetrics(registry), ReconcilerMetrics(registry)
    CronMetrics(registry), RetentionMetrics(registry)
    assert isinstance(registry, CollectorRegistry)
    answer = await client.get("/metrics")
    assert served_families(answer.text) == documented_metrics()


async def test_a_worker_whose_metrics_port_is_taken_refuses_to_start(
    procs: Any, sqlite_url: str
) -> None:
    import socket

    from tests.worker._procs import veracity_bin

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = procs.worker(sqlite_url, "w1",
                              argv=[veracity_bin(), "worker", "--metrics-port", str(port)])
        assert worker.proc.wait(timeout=30) != 0
    err = worker.stderr_text()
    assert f"worker.metrics_port: cannot listen on 127.0.0.1:{port}" in err, err
    assert "Traceback" not in err, err
