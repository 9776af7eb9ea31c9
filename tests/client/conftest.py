"""A live ``veracity server`` with its in-process worker, serving tests/client/client_app.py,
on the test's backend (``live``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_server import Server, free_port, server_env, server_process
from tests.worker._procs import REPO_ROOT

APP = "tests.client.client_app:app"
ECHO, FAIL, HOLD = "t:client/echo.run", "t:client/fail.run", "t:client/hold.run-cancellable"


@pytest.fixture
def live(database_url: str, tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    env = server_env(database_url, port, VERACITY_APP=APP, PYTHONPATH=str(REPO_ROOT),
                     VERACITY_POLL_INTERVAL="0.1s")
    with server_process(tmp_path, env, port, ["--worker"]) as server:
        server.wait_healthy()
        yield server
