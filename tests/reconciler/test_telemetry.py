"""Telemetry under the reconciler domain: Prometheus metrics on a real server's /metrics
(ticks by outcome, executions examined, actions by kind, engine errors by kind, tick
duration), and a JSON log line with domain=reconciler for every action taken."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reconciler._support import (
    FAST,
    FAST_LIMIT,
    SLOW,
    Rig,
    ServerProcess,
    config_toml,
    eventually,
    metric_value,
    server_processes,
    wait_status,
)
from veracity._logging import JsonFormatter
from veracity.core.states import Status
from veracity.testing.fake_n8n import FakeN8n, Script

pytestmark = pytest.mark.timeout(90)


async def test_every_action_writes_a_json_log_line_with_domain_reconciler(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    finished = await rig.start(Script(outcome="success", callback="lose"), SLOW)
    breached = await rig.start(Script.forever(callback="lose"), FAST)
    no_id = await rig.delegate_only(SLOW)
    forgotten = await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.forget(str(forgotten.run_id))
    await wait_status(rig, finished.run_id, "success")
    await asyncio.sleep(FAST_LIMIT + 0.25)

    with caplog.at_level(logging.INFO, logger="veracity.reconciler"):
        result = await rig.tick()

    acted = {(a.execution_id, a.kind) for a in result.actions}
    assert acted == {(finished.id, "terminate"), (breached.id, "terminate"),
                     (no_id, "flag"), (forgotten.id, "flag")}
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(r)) for r in caplog.records
             if r.name == "veracity.reconciler"]
    assert lines and all(line["domain"] == "reconciler" for line in lines)
    logged = {(uuid.UUID(line["execution_id"]), line["action"]) for line in lines
              if "action" in line}
    assert logged == acted, "exactly one log line per action taken"
    for line in lines:
        if "action" in line:
            assert line["level"] == "warning" and line["message"].startswith(line["action"])
    forgotten_line = next(line for line in lines
                          if line.get("execution_id") == str(forgotten.id))
    assert forgotten_line["external_execution_id"] == forgotten.run_id

    for name, labels, value in [
        ("veracity_reconciler_ticks_total", {"outcome": "ran"}, 1.0),
        ("veracity_reconciler_ticks_total", {"outcome": "skipped_lock"}, 0.0),
        ("veracity_reconciler_ticks_total", {"outcome": "error"}, 0.0),
        ("veracity_reconciler_executions_examined_total", {}, 4.0),
        ("veracity_reconciler_actions_total", {"kind": "terminate"}, 2.0),
        ("veracity_reconciler_actions_total", {"kind": "flag"}, 2.0),
        ("veracity_reconciler_engine_errors_total", {"kind": "not_found"}, 1.0),
        ("veracity_reconciler_tick_duration_seconds_count", {}, 1.0),
    ]:
        assert rig.registry.get_sample_value(name, labels) == value, (name, labels)
    await rig.assert_truthful()


async def submit_and_wait_started(client: httpx.AsyncClient, fake: FakeN8n, ffqn: str,
                                  script: Script) -> dict[str, Any]:
    """Submit through the server's API; its own worker triggers the fake with ``script``."""
    fake.queue_script("fulfil", script)
    response = await client.post("/v1/executions", json={"ffqn": ffqn, "params": []})
    assert response.status_code == 201, response.text
    eid = response.json()["id"]

    async def started() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/v1/executions/{eid}")).json()
        return body if body.get("external_execution_id") else None

    found: dict[str, Any] = await eventually(started, timeout=10, what=f"{eid} triggered")
    return found


async def wait_execution(client: httpx.AsyncClient, eid: str, field: str, value: Any = None,
                         timeout: float = 10.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/v1/executions/{eid}")).json()
        ok = body.get(field) is not None if value is None else body.get(field) == value
        return body if ok else None

    found: dict[str, Any] = await eventually(check, timeout=timeout, interval=0.1,
                                             what=f"{eid} {field}={value}")
    return found


@pytest.mark.slow
async def test_server_exposes_reconciler_metrics_and_logs_every_action(
    fake: FakeN8n, fake_url: str, database_url: str, tmp_path: Path
) -> None:
    def config(_: int, port: int) -> str:
        return config_toml(fake_url, f"http://127.0.0.1:{port}")

    # --worker: on PostgreSQL the server runs no worker unless asked to
    with server_processes(tmp_path, database_url, 1, config_for=config,
                          env={"VERACITY_RECONCILER_INTERVAL": "0.2",
                               "VERACITY_POLL_INTERVAL": "0.1"},
                          args=("--worker",)) as servers:
        server: ServerProcess = servers[0]
        await server.wait_healthy()
        async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as client:
            breached = await submit_and_wait_started(client, fake, FAST,
                                                     Script.forever(callback="lose"))
            finished = await submit_and_wait_started(
                client, fake, SLOW, Script(outcome="success", callback="lose"))
            erroring = await submit_and_wait_started(
                client, fake, SLOW, Script.forever(callback="lose", get_error=503))
            forgotten = await submit_and_wait_started(client, fake, SLOW,
                                                      Script.forever(callback="lose"))
            fake.forget(forgotten["external_execution_id"])
            completing = await submit_and_wait_started(
                client, fake, SLOW, Script(outcome="success", result={"ok": True}))

            await wait_execution(client, breached["id"], "status", "failed_transient")
            await wait_execution(client, finished["id"], "status", "failed_transient")
            await wait_execution(client, forgotten["id"], "flagged_at")
            done = await wait_execution(client, completing["id"], "status", "completed")
            assert done["result"] == {"ok": True}, "the fake's callback reached the server"
            flagged = (await client.get("/v1/executions", params={"flagged": "true"})).json()
            assert [i["id"] for i in flagged["items"]] == [forgotten["id"]]
            assert (await client.get(f"/v1/executions/{erroring['id']}")).json()[
                "status"] == "running"
            text = await server.metrics()

    assert "# TYPE veracity_reconciler_ticks_total counter" in text
    assert "# TYPE veracity_reconciler_tick_duration_seconds histogram" in text
    ran = metric_value(text, "veracity_reconciler_ticks_total", outcome="ran")
    assert ran is not None and ran >= 2
    assert metric_value(text, "veracity_reconciler_ticks_total", outcome="skipped_lock") == 0
    assert metric_value(text, "veracity_reconciler_ticks_total", outcome="error") == 0
    examined = metric_value(text, "veracity_reconciler_executions_examined_total")
    assert examined is not None and examined >= 5
    assert metric_value(text, "veracity_reconciler_actions_total", kind="terminate") == 2
    assert metric_value(text, "veracity_reconciler_actions_total", kind="flag") == 1
    server_errors = metric_value(text, "veracity_reconciler_engine_errors_total",
                                 kind="server_error")
    assert server_errors is not None and server_errors >= 1
    assert (metric_value(text, "veracity_reconciler_engine_errors_total", kind="not_found")
            or 0) >= 1
    count = metric_value(text, "veracity_reconciler_tick_duration_seconds_count")
    assert count is not None and count >= ran
    assert metric_value(text, "veracity_reconciler_tick_duration_seconds_sum") is not None
    assert metric_value(text, "veracity_reconciler_tick_duration_seconds_bucket",
                        le="+Inf") == count

    lines = [r for r in server.log_lines() if r.get("domain") == "reconciler"]
    actions = {(r["execution_id"], r["action"]) for r in lines if "action" in r}
    assert actions == {(breached["id"], "terminate"), (finished["id"], "terminate"),
                       (forgotten["id"], "flag")}, server.stderr()
    assert Status.COMPLETED not in {r.get("action") for r in lines}
