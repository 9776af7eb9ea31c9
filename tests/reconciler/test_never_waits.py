"""The reconciler never makes anyone wait for it (issue 5, item 4): API requests answer
while a tick is waiting on a slow engine, and the tick holds no database transaction open
meanwhile.

"Waiting on the engine" is observed at the engine itself: the fake n8n is served behind a
recorder that knows which requests are under way (not yet answered), and the reconciler
reaches it under its own URL prefix (/s0). A request under way before something started and
still under way after it ended proves the tick was waiting on the engine all along; the
assertions are on that order of events, not on timings."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests._helpers import pg_store_fixture
from tests.reconciler._support import (
    FAST,
    FAST_LIMIT,
    SLOW,
    Span,
    Tagged,
    config_toml,
    eventually,
    external_config,
    metric_value,
    server_processes,
    wait_status,
)
from veracity.adapters.n8n import N8nEngine
from veracity.core.states import Status
from veracity.maintenance.reconciler import ReconcilerService
from veracity.store import Store
from veracity.testing.fake_n8n import Script

pytestmark = pytest.mark.timeout(60)

LATENCY = 1.5
"""Seconds the slow fake n8n takes to answer each request."""


async def fresh_engine_call(tagged: Tagged, tag: str = "s0",
                            within: float = 0.25) -> tuple[int, Span]:
    """An engine request of ``tag`` under way that began less than ``within`` seconds ago
    (so that, with the fake's latency, it stays under way for a good while yet)."""

    def check() -> tuple[int, Span] | None:
        now = time.monotonic()
        for number, span in tagged.recorder.in_flight(tag).items():
            if now - span.start < within and span.path.startswith("/api/v1/executions/"):
                return number, span
        return None

    found: tuple[int, Span] = await eventually(check, timeout=10, interval=0.005,
                                               what="a tick waiting on the engine")
    return found


async def answered(tagged: Tagged, number: int, begun: Span) -> Span:
    """The span of request ``number`` once it has been answered."""

    def check() -> Span | None:
        if number in tagged.recorder.in_flight(begun.tag):
            return None
        return next((s for s in tagged.recorder.spans
                     if s.tag == begun.tag and s.start == begun.start
                     and s.path == begun.path), None)

    span: Span = await eventually(check, timeout=10, what=f"engine request {number} answered")
    return span


@pytest.mark.slow
async def test_api_requests_answer_while_a_tick_waits_on_a_slow_engine(
    tagged: Tagged, store: Store, database_url: str, tmp_path: Path
) -> None:
    rig = tagged.rig(store)
    try:
        running = [await rig.start(Script.forever(callback="lose"), SLOW) for _ in range(3)]
    finally:
        await rig.engine.aclose()
    tagged.fake.latency = LATENCY  # from now on every engine answer takes this long

    def config(_: int, port: int) -> str:
        return config_toml(f"{tagged.url}/s0", f"http://127.0.0.1:{port}")

    # no worker: the submitted execution stays pending, nothing but the reconciler calls
    # the engine; ticks follow each other almost back to back
    with server_processes(tmp_path, database_url, 1, config_for=config,
                          env={"VERACITY_RECONCILER_INTERVAL": "0.1"},
                          args=("--no-worker",)) as servers:
        server = servers[0]
        await server.wait_healthy()
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
            await client.get("/healthz")  # a warm connection: measure the API, not TCP
            number, begun = await fresh_engine_call(tagged)
            timeline: list[tuple[str, float, float, httpx.Response]] = []

            async def timed(what: str, method: str, url: str, **kw: Any) -> httpx.Response:
                sent = time.monotonic()
                response = await client.request(method, url, **kw)
                timeline.append((what, sent, time.monotonic(), response))
                return response

            created = await timed("POST /v1/executions", "POST", "/v1/executions",
                                  json={"ffqn": SLOW, "params": [{"order": "A-1"}]})
            assert created.status_code == 201, created.text
            eid = created.json()["id"]
            got = await timed("GET /v1/executions/{id}", "GET", f"/v1/executions/{eid}")
            health = await timed("GET /healthz", "GET", "/healthz")
            examined = await timed("GET running", "GET", f"/v1/executions/{running[0].id}")

            call = await answered(tagged, number, begun)
            text = await server.metrics()

    assert got.status_code == 200 and got.json()["status"] == "pending", got.text
    assert health.status_code == 200 and health.json()["database"] == "ok", health.text
    assert examined.status_code == 200 and examined.json()["status"] == "running"
    # the order of events: the engine call began before the first request was sent and was
    # answered only after the last response had arrived — the tick was waiting on it all along
    first_sent = timeline[0][1]
    last_received = timeline[-1][2]
    assert call.start < first_sent, (call, timeline[0][:3])
    assert last_received < call.end, (
        f"the API answered only after the engine did: {[t[:3] for t in timeline]}, "
        f"engine call {call}")
    for what, sent, received, _ in timeline:
        assert received - sent < LATENCY, f"{what} took {received - sent:.3f}s"
    assert metric_value(text, "veracity_reconciler_ticks_total", outcome="error") == 0
    assert "Traceback" not in server.stderr()


async def pg_backends(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    """Every client backend of this test's database, from pg_stat_activity."""
    cur = await conn.execute(
        "SELECT a.pid, a.state, a.xact_start, a.backend_xid::text AS xid, a.query,"
        " a.pid = pg_backend_pid() AS mine,"
        " EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'"
        "         AND l.granted) AS holds_advisory_lock"
        " FROM pg_stat_activity a"
        " WHERE a.datname = current_database() AND a.backend_type = 'client backend'")
    names = [c.name for c in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]


pg_store = pg_store_fixture(pool_size=4)


async def test_no_transaction_is_open_while_the_tick_waits_on_the_engine(
    tagged: Tagged, pg_store: Store, pg_url: str
) -> None:
    """PostgreSQL: sampled again and again during a tick, whenever an engine request was
    under way both before and after the sample, pg_stat_activity shows no backend of this
    database in a transaction but the sampling one: the pool's connections idle, and the
    advisory-lock session idle too (it runs in autocommit: the lock is a session lock)."""
    rig = tagged.rig(pg_store)
    try:
        quiet = [await rig.start(Script.forever(callback="lose"), SLOW) for _ in range(3)]
        finished = await rig.start(Script(outcome="success", callback="lose"), SLOW)
        breached = await rig.start(Script.forever(callback="lose"), FAST)  # stop, inspect
        await wait_status(rig, finished.run_id, "success")
    finally:
        await rig.engine.aclose()
    await asyncio.sleep(FAST_LIMIT + 0.2)
    tagged.fake.latency = 0.6

    external = external_config(f"{tagged.url}/s0")
    engine = N8nEngine(external.engines["n8n"])
    service = ReconcilerService(pg_store, {"n8n": engine}, external.limits,
                                metrics=rig.metrics)
    samples: list[list[dict[str, Any]]] = []
    try:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            tick = asyncio.create_task(service.run_once())
            while not tick.done():
                before = set(tagged.recorder.in_flight("s0"))
                rows = await pg_backends(conn)
                after = set(tagged.recorder.in_flight("s0"))
                if before & after:  # the tick was waiting on the engine throughout
                    samples.append(rows)
                await asyncio.sleep(0.03)
            result = await tick
    finally:
        await engine.aclose()

    # the tick did its work: it asked (inspect, stop, inspect again) and then wrote
    assert result.ran and result.stops_requested == 1
    assert {(a.execution_id, a.kind) for a in result.actions} == {
        (finished.id, "terminate"), (breached.id, "terminate")}
    assert len(samples) >= 5, f"only {len(samples)} samples while waiting on the engine"
    lock_sessions = 0
    for rows in samples:
        mine = [r for r in rows if r["mine"]]
        assert len(mine) == 1 and mine[0]["xact_start"] is not None  # this query's own
        others = [r for r in rows if not r["mine"]]
        assert others, "the reconciler's connections are not there"
        for r in others:
            assert r["state"] not in ("idle in transaction",
                                      "idle in transaction (aborted)"), r
            seen = (f"pid {r['pid']}: {r['state']}, query {r['query']!r}, "
                    f"lock {r['holds_advisory_lock']}, xid {r['xid']}")
            if r["holds_advisory_lock"] and r["state"] == "active":
                # the lock session's keep-alive, caught while it runs (docs/workers.md,
                # "Recovery"): one autocommit statement, never a transaction left open
                assert r["query"].strip() == "SELECT 1 AS ok" and r["xid"] is None, seen
                continue
            assert r["xact_start"] is None and r["xid"] is None, seen
            assert r["state"] == "idle", seen
        holders = [r for r in others if r["holds_advisory_lock"]]
        assert len(holders) == 1, others  # the tick's lock session, idle in autocommit
        lock_sessions += 1
    assert lock_sessions == len(samples)
    for s in quiet:
        assert (await rig.get(s.id)).status == Status.RUNNING
    await rig.assert_truthful()
