"""``veracity server`` as a real process on a loopback port: it migrates at start, serves
the API over real HTTP, logs JSON, and stops cleanly (exit 0) on SIGTERM and SIGINT."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import stable
from tests.conftest import run_async

APP = "veracity.examples.shop:app"
ORDERS = "shop:orders/process.run"
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0

_found = shutil.which("veracity", path=str(Path(sys.executable).parent))
assert _found is not None, "the veracity console script is not installed in this venv"
VERACITY: str = _found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    stdout_path: Path
    stderr_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_healthy(self) -> dict[str, Any]:
        deadline = time.monotonic() + START_TIMEOUT
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"server exited with {self.proc.returncode} before "
                                         f"answering:\n{self.stderr()}")
                try:
                    response = client.get(f"{self.url}/healthz")
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                assert response.status_code == 200, response.text
                health: dict[str, Any] = response.json()
                return health
        raise AssertionError(f"no answer on /healthz within {START_TIMEOUT}s:\n{self.stderr()}")

    def log_lines(self) -> list[dict[str, Any]]:
        """Every line on stderr, each one a JSON object."""
        lines = [line for line in self.stderr().splitlines() if line.strip()]
        parsed = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                raise AssertionError(f"not a JSON log line: {line!r}") from None
            assert isinstance(record, dict), line
            parsed.append(record)
        return parsed


def server_env(database_url: str, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env.update(VERACITY_DATABASE_URL=database_url, VERACITY_APP=APP,
               VERACITY_HOST="127.0.0.1", VERACITY_PORT=str(port))
    env.update(extra)
    return env


@contextmanager
def server_process(tmp_path: Path, env: dict[str, str], port: int) -> Iterator[Server]:
    out, err = tmp_path / "server.out", tmp_path / "server.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([VERACITY, "server"], env=env, cwd=tmp_path,
                                stdout=stdout, stderr=stderr)
    try:
        yield Server(proc, port, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=STOP_TIMEOUT)


async def _count(url: str) -> int:
    from veracity.models import ExecutionFilter
    from veracity.store import open_store

    store = await open_store(url)
    try:
        return len(await store.execution_list(ExecutionFilter(), limit=1000))
    finally:
        await store.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("backend_name", ["sqlite", "postgresql"])
def test_server_serves_and_stops_cleanly(
    request: pytest.FixtureRequest, tmp_path: Path, backend_name: str, sig: signal.Signals
) -> None:
    if backend_name == "sqlite":
        # a brand-new file: the server must migrate it at start
        db_path = tmp_path / "data" / "new.db"
        db_path.parent.mkdir()
        database_url = f"sqlite:///{db_path}"
    else:
        database_url = request.getfixturevalue("pg_url")
    port = free_port()
    with server_process(tmp_path, server_env(database_url, port), port) as server:
        health = server.wait_healthy()
        assert health == {"status": "ok", "database": "ok", "backend": backend_name}
        # printed just after uvicorn reports it started: give it a moment
        deadline = time.monotonic() + 2.0
        while f"http://127.0.0.1:{port}" not in server.stdout() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert f"http://127.0.0.1:{port}" in server.stdout(), server.stdout()

        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            # scheduled in the future, so that a worker in the server leaves it pending
            body = {"ffqn": ORDERS, "params": ["o-1", 100], "idempotency_key": "k-1",
                    "scheduled_at": "2099-01-01T00:00:00Z"}
            created = client.post("/v1/executions", json=body)
            assert created.status_code == 201, created.text
            execution = created.json()
            assert execution["status"] == "pending"
            again = client.post("/v1/executions", json=body)
            assert again.status_code == 200, again.text
            assert again.json()["id"] == execution["id"]

            listed = client.get("/v1/executions")
            assert listed.status_code == 200, listed.text
            assert [e["id"] for e in listed.json()["items"]] == [execution["id"]]
            got = client.get(f"/v1/executions/{execution['id']}")
            assert got.status_code == 200, got.text
            assert stable(got.json()) == stable(execution)
            history = client.get(f"/v1/executions/{execution['id']}/history")
            assert [e["kind"] for e in history.json()["items"]] == ["pending"]
            # errors over real HTTP are JSON too
            missing = client.get(f"/v1/executions/{uuid.uuid4()}")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "not_found"
            bad = client.post("/v1/executions", content=b"{nope",
                              headers={"content-type": "application/json"})
            assert bad.status_code == 400
            assert bad.json()["error"]["code"] == "malformed_json"
            docs = client.get("/openapi.json")
            assert "/v1/executions" in docs.json()["paths"]

        started = time.monotonic()
        server.proc.send_signal(sig)
        returncode = server.proc.wait(timeout=STOP_TIMEOUT)
        assert returncode == 0, server.stderr()
        assert time.monotonic() - started < 5.0

    assert "Traceback" not in server.stderr()
    records = server.log_lines()
    messages = [r.get("message") for r in records]
    assert "started" in messages, messages
    assert "stopped" in messages, messages
    assert messages.index("started") < messages.index("stopped")
    assert all({"at", "level", "message"} <= r.keys() for r in records), records
    assert port_is_free(port)
    # the submission is durable: it is in the database after the server is gone
    assert run_async(_count(database_url)) == 1


def test_server_with_a_missing_app_fails_fast(tmp_path: Path) -> None:
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path}/x.db", port,
                     VERACITY_APP="nonexistent.module:app")
    started = time.monotonic()
    with server_process(tmp_path, env, port) as server:
        returncode = server.proc.wait(timeout=START_TIMEOUT)
        elapsed = time.monotonic() - started
    assert returncode == 1, (server.stdout(), server.stderr())
    assert elapsed < 5.0
    err = server.stderr()
    assert "Traceback" not in err, err
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, err
    assert "nonexistent.module" in error_lines[0]
    # it never served: no URL printed, nothing logged as started, the port never taken
    assert "http://" not in server.stdout()
    assert '"started"' not in err
    assert port_is_free(port)


def test_server_with_an_invalid_config_file_fails_fast(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "veracity.toml").write_text("[worker]\nlease_ttl = -5\n")
    env = server_env(f"sqlite:///{tmp_path}/x.db", port)
    with server_process(tmp_path, env, port) as server:
        returncode = server.proc.wait(timeout=START_TIMEOUT)
    assert returncode == 1, (server.stdout(), server.stderr())
    err = server.stderr().strip()
    assert "Traceback" not in err, err
    assert err.startswith("error: veracity.toml:2"), err
    assert "http://" not in server.stdout()
