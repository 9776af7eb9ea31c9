"""Telemetry under the reconciler domain: Prometheus metrics on a real server's /metrics
(ticks by outcome, executions examined, actions by kind, engine errors by kind, tick
duration), and a JSON log line with domain=reconciler for every action taken."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any, cast

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
from veracity.adapters.base import Engine
from veracity.core.states import Status
from veracity.maintenance._loop import run_forever
from veracity.telemetry import Telemetry
from veracity.testing.fake_n8n import FakeN8n, Script
from veracity.worker.trigger import trigger

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
    assert result.stops_requested == 1  # the breached run: stopped, then terminated
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(r)) for r in caplog.records
             if r.name == "veracity.reconciler"]
    assert lines and all(line["domain"] == "reconciler" for line in lines)
    logged = [(uuid.UUID(line["execution_id"]), line["action"]) for line in lines
              if "action" in line]
    assert sorted(logged) == sorted(acted | {(breached.id, "stop")}), (
        "exactly one log line per action taken, the remote stop included")
    for line in lines:
        if "action" in line:
            assert line["level"] == "warning" and line["message"].startswith(line["action"])
    forgotten_line = next(line for line in lines
                          if line.get("execution_id") == str(forgotten.id))
    assert forgotten_line["external_execution_id"] == forgotten.run_id
    stop_line = next(line for line in lines if line.get("action") == "stop")
    assert stop_line["execution_id"] == str(breached.id)
    assert stop_line["external_execution_id"] == breached.run_id
    assert stop_line["engine_finished"] is True

    for name, labels, value in [
        ("veracity_reconciler_ticks_total", {"outcome": "ran"}, 1.0),
        ("veracity_reconciler_ticks_total", {"outcome": "skipped_lock"}, 0.0),
        ("veracity_reconciler_ticks_total", {"outcome": "error"}, 0.0),
        ("veracity_reconciler_executions_examined_total", {}, 4.0),
        ("veracity_reconciler_actions_total", {"kind": "terminate"}, 2.0),
        ("veracity_reconciler_actions_total", {"kind": "flag"}, 2.0),
        ("veracity_reconciler_actions_total", {"kind": "stop"}, 1.0),
        ("veracity_reconciler_engine_errors_total", {"kind": "not_found"}, 1.0),
        ("veracity_reconciler_tick_duration_seconds_count", {}, 1.0),
    ]:
        assert rig.registry.get_sample_value(name, labels) == value, (name, labels)
    await rig.assert_truthful()


async def test_every_stop_request_is_counted_and_logged_as_an_action(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The table's second row (limit breached, engine still running): each stop request
    counts as an action of kind "stop" and logs one JSON line, whether or not the engine
    then confirms the run finished; the local terminate that follows is its own action."""
    s = await rig.start(Script.forever(callback="lose", stop_failures=1), FAST)
    await asyncio.sleep(FAST_LIMIT + 0.25)
    formatter = JsonFormatter()

    def stop_lines() -> list[dict[str, Any]]:
        lines = [json.loads(formatter.format(r)) for r in caplog.records
                 if r.name == "veracity.reconciler"]
        return [line for line in lines if line.get("action") == "stop"]

    with caplog.at_level(logging.INFO, logger="veracity.reconciler"):
        first = await rig.tick()  # the stop fails: still running
    assert first.stops_requested == 1 and first.actions == []
    assert rig.sample("veracity_reconciler_actions_total", kind="stop") == 1
    assert rig.sample("veracity_reconciler_actions_total", kind="terminate") == 0
    [line] = stop_lines()
    assert line["domain"] == "reconciler" and line["level"] == "warning"
    assert line["execution_id"] == str(s.id)
    assert line["external_execution_id"] == s.run_id
    assert line["engine_finished"] is False
    assert line["stop"].startswith("failed")
    assert (await rig.get(s.id)).status == Status.RUNNING

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="veracity.reconciler"):
        second = await rig.tick()  # the stop works: confirmed, then ended locally
    assert second.stops_requested == 1
    assert [a.kind for a in second.actions] == ["terminate"]
    assert rig.sample("veracity_reconciler_actions_total", kind="stop") == 2
    assert rig.sample("veracity_reconciler_actions_total", kind="terminate") == 1
    assert rig.sample("veracity_reconciler_actions_total", kind="flag") == 0
    [line] = stop_lines()
    assert line["execution_id"] == str(s.id) and line["engine_finished"] is True
    assert line["stop"] == "ok" and line["engine_status"] == "canceled"
    assert (await rig.get(s.id)).status == Status.FAILED_TRANSIENT
    await rig.assert_truthful()


async def test_a_tick_that_fails_counts_an_error_and_the_next_one_runs(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store raises in the middle of a tick: the tick counts as an error (and is logged
    by the loop), its lock is released, and the loop's next tick runs normally."""
    finished = await rig.start(Script(outcome="success", callback="lose"), SLOW)
    await wait_status(rig, finished.run_id, "success")
    original = rig.store.execution_external_running
    calls = 0

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the database went away (test)")
        return await original(*args, **kwargs)

    monkeypatch.setattr(rig.store, "execution_external_running", flaky)
    service = rig.service()
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="veracity.reconciler"):
        loop = asyncio.create_task(run_forever(service, 0.05, stop))
        try:
            await eventually(
                lambda: rig.sample("veracity_reconciler_ticks_total", outcome="ran") >= 1,
                timeout=5, what="a tick that ran after the failed one")
        finally:
            stop.set()
            await asyncio.wait_for(loop, 5)

    assert rig.sample("veracity_reconciler_ticks_total", outcome="error") == 1
    assert rig.sample("veracity_reconciler_ticks_total", outcome="skipped_lock") == 0
    assert rig.sample("veracity_reconciler_tick_duration_seconds_count") >= 2
    failed = [r for r in caplog.records if r.getMessage().startswith("tick failed")]
    assert len(failed) == 1 and "the database went away" in failed[0].getMessage()
    assert getattr(failed[0], "domain", None) == "reconciler"
    # the tick after the error examined and acted as usual
    assert (await rig.get(finished.id)).status == Status.FAILED_TRANSIENT
    assert rig.sample("veracity_reconciler_actions_total", kind="terminate") == 1
    assert rig.sample("veracity_reconciler_executions_examined_total") >= 1
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
    assert metric_value(text, "veracity_reconciler_actions_total", kind="stop") == 1
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
    actions = sorted((r["execution_id"], r["action"]) for r in lines if "action" in r)
    assert actions == sorted([(breached["id"], "stop"), (breached["id"], "terminate"),
                              (finished["id"], "terminate"), (forgotten["id"], "flag")]
                             ), server.stderr()
    stop_line = next(r for r in lines if r.get("action") == "stop")
    assert stop_line["external_execution_id"] == breached["external_execution_id"]
    assert stop_line["engine_finished"] is True
    assert Status.COMPLETED not in {r.get("action") for r in lines}


async def test_ends_and_flags_are_counted_by_who_wrote_them(rig: Rig) -> None:
    """The telemetry of docs/operations.md (Metrics): the reconciler's ends by workflow and
    status, its flags under by="reconciler"; an ambiguous trigger's flag under
    by="worker", with its log line an action like the reconciler's."""
    telemetry = Telemetry()
    finished = await rig.start(Script(outcome="success", callback="lose"), SLOW)
    forgotten = await rig.start(Script.forever(callback="lose"), SLOW)
    rig.fake.forget(str(forgotten.run_id))
    await wait_status(rig, finished.run_id, "success")

    result = await rig.tick(telemetry=telemetry)

    assert {(a.execution_id, a.kind) for a in result.actions} == {
        (finished.id, "terminate"), (forgotten.id, "flag")}
    done, flagged = await rig.get(finished.id), await rig.get(forgotten.id)
    assert done.status.is_terminal and flagged.flag_kind is not None
    get = telemetry.registry.get_sample_value
    assert get("veracity_executions_ended_total",
               {"ffqn": SLOW, "status": str(done.status)}) == 1
    assert get("veracity_execution_run_seconds_count", {}) == 1
    assert get("veracity_flags_raised_total",
               {"by": "reconciler", "kind": flagged.flag_kind}) == 1
    # a second tick writes nothing new, and counts nothing new
    await rig.tick(telemetry=telemetry)
    assert get("veracity_flags_raised_total",
               {"by": "reconciler", "kind": flagged.flag_kind}) == 1


async def test_an_ambiguous_trigger_flag_is_counted_as_the_workers(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry()
    execution, claim = await rig.submit_claim(SLOW)
    rig.fake.script_for_execution(str(execution.id), Script.forever(callback="lose"))
    engine = cast(Engine, Raising(rig.engine))  # start alone is called
    assert rig.external.public_url is not None
    with caplog.at_level(logging.WARNING, logger="veracity.worker"):
        outcome = await trigger(rig.store, engine, rig.external.workflows[SLOW], execution,
                                claim, rig.external.public_url, telemetry=telemetry)
    assert outcome.startswith("ambiguous")
    assert (await rig.get(execution.id)).flag_kind == "trigger_unknown"
    assert telemetry.registry.get_sample_value(
        "veracity_flags_raised_total", {"by": "worker", "kind": "trigger_unknown"}) == 1
    (line,) = [json.loads(JsonFormatter().format(r)) for r in caplog.records
               if r.getMessage() == "trigger outcome unknown"]
    assert (line["action"], line["flag_kind"], line["execution_id"]) == (
        "flag", "trigger_unknown", str(execution.id))


class Raising:
    """The real adapter, whose start raises after the engine took the trigger: the outcome
    is unknown to the worker (docs/external.md, "Starting a run, never twice")."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        await self.inner.start(*args, **kwargs)
        raise RuntimeError("the answer was lost")
