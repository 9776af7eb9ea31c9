"""``veracity server`` and API tokens as real processes (docs/security.md): a non-loopback
bind needs tokens by default; with auth.required = false it refuses to start unless told
``--insecure``; tokens made by the CLI while the server runs are taken at once, revoked
ones refused at once. Each server binds 0.0.0.0 on a free port and is stopped right away."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.test_server import (
    ORDERS,
    START_TIMEOUT,
    STOP_TIMEOUT,
    VERACITY,
    Server,
    free_port,
    port_is_free,
    server_env,
    server_process,
)

ANYWHERE = "0.0.0.0"  # every interface: not loopback


def stop(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=STOP_TIMEOUT) == 0, server.stderr()


def messages(server: Server) -> list[str]:
    return [str(r.get("message")) for r in server.log_lines()]


def wait_printed(server: Server, text: str) -> str:
    deadline = time.monotonic() + 2.0  # printed just after uvicorn reports it started
    while text not in server.stdout() and time.monotonic() < deadline:
        time.sleep(0.02)
    return server.stdout()


def cli(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run([VERACITY, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_a_non_loopback_bind_without_auth_refuses_to_start(tmp_path: Path) -> None:
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path}/v.db", port, VERACITY_HOST=ANYWHERE,
                     VERACITY_AUTH_REQUIRED="false")
    with server_process(tmp_path, env, port) as server:
        returncode = server.proc.wait(timeout=START_TIMEOUT)
    assert returncode == 1, (server.stdout(), server.stderr())
    err = server.stderr().strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(
        f"error: refusing to serve on {ANYWHERE} without authentication: auth.required is "
        f"false and {ANYWHERE} is not a loopback address"), err
    assert f"port {port}" in err and "--insecure" in err and "veracity token create" in err
    assert "http://" not in server.stdout()
    assert port_is_free(port)
    assert not (tmp_path / "v.db").exists(), "refused before touching the database"


def test_insecure_serves_a_non_loopback_bind_without_tokens(tmp_path: Path) -> None:
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path}/v.db", port, VERACITY_HOST=ANYWHERE,
                     VERACITY_AUTH_REQUIRED="false")
    with server_process(tmp_path, env, port, ["--insecure"]) as server:
        server.wait_healthy()
        assert "no API token required" in wait_printed(server, "required")
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            assert client.get("/v1/executions").status_code == 200
            # a token that is sent is still checked
            bad = client.get("/v1/executions", headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401, bad.text
        stop(server)
    assert any("WITHOUT authentication (--insecure)" in m for m in messages(server))


def test_a_non_loopback_bind_requires_tokens_by_default(tmp_path: Path) -> None:
    port = free_port()
    database_url = f"sqlite:///{tmp_path}/v.db"
    env = server_env(database_url, port, VERACITY_HOST=ANYWHERE)
    with server_process(tmp_path, env, port) as server:
        server.wait_healthy()
        assert "API tokens required" in wait_printed(server, "required")
        started = [r for r in server.log_lines() if r.get("message") == "started"]
        assert started and started[0]["auth_required"] is True, started
        assert any("none is active" in m for m in messages(server))
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            refused = client.get("/v1/executions")
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"]["code"] == "unauthorized"
            for path in ("/healthz", "/metrics", "/openapi.json"):
                assert client.get(path).status_code == 200, path

            # made by the CLI against the same database while the server runs
            cli_env = {**env}
            reader = cli(cli_env, tmp_path, "token", "create", "--name", "reader",
                         "--scope", "executions:read").strip()
            writer = cli(cli_env, tmp_path, "token", "create", "--name", "writer",
                         "--scope", "executions:submit", "--expires", "1h").strip()
            read = {"Authorization": f"Bearer {reader}"}
            write = {"Authorization": f"Bearer {writer}"}
            assert client.get("/v1/executions", headers=read).status_code == 200
            body: dict[str, Any] = {"ffqn": ORDERS, "params": ["o", 1],
                                    "scheduled_at": "2099-01-01T00:00:00Z"}
            forbidden = client.post("/v1/executions", json=body, headers=read)
            assert forbidden.status_code == 403, forbidden.text
            assert forbidden.json()["error"]["scope"] == "executions:submit"
            created = client.post("/v1/executions", json=body, headers=write)
            assert created.status_code == 201, created.text

            cli(cli_env, tmp_path, "token", "revoke", "reader")
            gone = client.get("/v1/executions", headers=read)
            assert gone.status_code == 401, gone.text
            assert "revoked" in gone.json()["error"]["message"]

            listed = json.loads(cli(cli_env, tmp_path, "token", "list", "--json"))
            used = {i["name"]: i["last_used_at"] for i in listed["items"]}
            assert used["reader"] is not None and used["writer"] is not None
        stop(server)
    assert port_is_free(port)
