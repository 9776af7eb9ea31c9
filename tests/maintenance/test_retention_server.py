"""Retention as a ``veracity server`` runs it (docs/operations.md, Retention): a real server
process on loopback, on both backends, deletes what ended longer ago than
``retention.terminal`` at every ``retention.interval`` and counts it on ``/metrics``; with
``retention.terminal = 0`` it deletes nothing and still serves the metrics, at zero."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.test_server import free_port, server_env, server_process

STOCK = "shop:monitor/stock.run-cancellable"


def _deleted(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('veracity_retention_deleted_total{kind="executions"}'):
            return float(line.split()[1])
    raise AssertionError(f"no veracity_retention_deleted_total on /metrics:\n{metrics}")


@pytest.mark.parametrize("backend_name", ["sqlite", "postgresql"])
@pytest.mark.parametrize("terminal", ["1s", "0"], ids=["on", "off"])
def test_the_server_prunes_what_ended_before_retention_terminal(
    request: pytest.FixtureRequest, tmp_path: Path, backend_name: str, terminal: str
) -> None:
    if backend_name == "sqlite":
        database_url = f"sqlite:///{tmp_path / 'retention.db'}"
    else:
        database_url = request.getfixturevalue("pg_url")
    port = free_port()
    env = server_env(database_url, port, VERACITY_RETENTION_TERMINAL=terminal,
                     VERACITY_RETENTION_INTERVAL="1s")
    with server_process(tmp_path, env, port) as server:
        server.wait_healthy()
        with httpx.Client(base_url=server.url, timeout=10.0) as client:
            # ended: a pending execution cancelled (no worker needed on either backend)
            ended = client.post("/v1/executions", json={
                "ffqn": STOCK, "params": ["sku-1"], "scheduled_at": "2099-01-01T00:00:00Z"})
            assert ended.status_code == 201, ended.text
            cancelled = client.put(f"/v1/executions/{ended.json()['id']}/cancel")
            assert cancelled.json()["status"] == "cancelled", cancelled.text
            # an unfinished one: never deleted, however long retention runs
            later = client.post("/v1/executions", json={
                "ffqn": STOCK, "params": ["sku-2"], "scheduled_at": "2099-01-01T00:00:00Z"})
            assert later.status_code == 201, later.text
            # ended 1 s ago by the next pass at the latest, which comes within 1 s
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline:
                gone = client.get(f"/v1/executions/{ended.json()['id']}").status_code == 404
                if gone:
                    break
                time.sleep(0.1)
            assert gone is (terminal != "0")
            assert client.get(f"/v1/executions/{later.json()['id']}").status_code == 200
            assert _deleted(client.get("/metrics").text) == (1.0 if terminal != "0" else 0.0)
