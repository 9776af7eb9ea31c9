"""Secrets through real processes (docs/http.md), on both backends.

- A start whose bindings cannot be honoured is refused by ``veracity server`` and
  ``veracity worker`` alike, with one line naming the binding, the file or the key, and
  nothing written.
- The leak test: executions that use two known secrets (one from the environment, one from
  the secrets file) run, fail and retry against a loopback server that echoes the headers
  back; then every place a value could end in is searched: a dump of the database
  (``pg_dump``; the SQLite files' bytes), the processes' JSON logs at debug level
  (tracebacks included), the API's answers, ``/metrics``, and the CLI's output. The value
  is nowhere, while the positive controls show each place was really exercised.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._echo import EchoServer, echo_server
from tests._needs import missing
from tests._pg import free_port
from tests.worker._procs import Processes, WorkerProcess, veracity_bin, wait_until, worker_env

APP = "tests.worker.http_app:app"
TERMINAL = {"completed", "failed", "cancelled", "failed_transient"}


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with echo_server() as server:
        yield server


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)
    return path


def config(folder: Path, echo: EchoServer, dead_port: int, secrets_file: Path | None) -> Path:
    head = f'secrets_file = "{secrets_file}"\n' if secrets_file else ""
    return write(folder / "veracity.toml", head + f'''
[[http]]
name = "echo"
origin = "{echo.origin}"
methods = ["GET", "POST"]
headers = {{ Authorization = "Bearer ${{secret:api_token}}", X-Api-Key = "${{secret:api_key}}" }}

[[http]]
name = "nobody_home"
origin = "http://127.0.0.1:{dead_port}"
methods = ["GET"]
headers = {{ Authorization = "Bearer ${{secret:api_token}}" }}
''', 0o644)


def env_of(database_url: str, conf: Path, **extra: str) -> dict[str, str]:
    return {"VERACITY_CONFIG": str(conf), "VERACITY_APP": APP, **extra}


def cli(database_url: str, env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([veracity_bin(), *args], env=worker_env(database_url, env),
                          capture_output=True, text=True, timeout=60)


def server_argv(port: int, *extra: str) -> list[str]:
    return [veracity_bin(), "server", "--host", "127.0.0.1", "--port", str(port), *extra]


# --- refused starts ---------------------------------------------------------------------------


async def registered_workers(database_url: str) -> int:
    from tests.durable._procs import sql
    rows = await sql(database_url, "SELECT count(*) FROM veracity_workers",
                     "SELECT count(*) FROM veracity_workers")
    return int(rows[0][0])


@pytest.mark.parametrize("command", ["server", "worker"])
async def test_a_start_the_bindings_cannot_honour_is_refused_naming_why(
    tmp_path: Path, database_url: str, procs: Processes, echo: EchoServer, command: str,
) -> None:
    secrets = write(tmp_path / "secrets.toml", 'api_key = "key-0123456789"\n')
    conf = config(tmp_path, echo, free_port(), secrets)
    token = {"VERACITY_SECRET_API_TOKEN": "tok-0123456789"}
    port = free_port()
    argv = server_argv(port) if command == "server" else [veracity_bin(), "worker"]
    # a secret a binding names, defined nowhere
    p = procs.worker(database_url, f"{command}-undefined", argv=argv,
                     env=env_of(database_url, conf))
    assert await p.wait(30) == 1, p.describe()
    assert p.stderr_text().strip().splitlines()[-1] == (
        "error: http binding echo: secret api_token is not defined: set "
        f"VERACITY_SECRET_API_TOKEN or add api_token = \"...\" to secrets_file {secrets}")
    # a secrets file others can read
    os.chmod(secrets, 0o640)
    p = procs.worker(database_url, f"{command}-mode", argv=argv,
                     env=env_of(database_url, conf, **token))
    assert await p.wait(30) == 1, p.describe()
    assert p.stderr_text().strip().splitlines()[-1] == (
        f"error: secrets_file {secrets}: readable or writable by others than its owner "
        f"(mode 0640); make it private: chmod 600 {secrets}")
    os.chmod(secrets, 0o600)
    # a malformed binding: refused as the configuration loads, with its line
    text = conf.read_text()
    write(conf, text.replace('methods = ["GET", "POST"]', 'methods = ["GET", "YANK"]'), 0o644)
    p = procs.worker(database_url, f"{command}-method", argv=argv,
                     env=env_of(database_url, conf, **token))
    assert await p.wait(30) == 1, p.describe()
    line = text.splitlines().index('methods = ["GET", "POST"]') + 1
    assert p.stderr_text().strip().splitlines()[-1] == (
        f"error: {conf}:{line}: http[0].methods: unknown method 'YANK': a binding may allow "
        "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
    # nothing was written: no worker registered, no request sent, no port bound
    assert await registered_workers(database_url) == 0
    assert echo.requests() == []
    for p in procs.started:
        assert "http://" not in p.stdout_text(), p.describe()
    # and with the secret defined, the same configuration starts
    write(conf, text, 0o644)
    p = procs.worker(database_url, f"{command}-ok", argv=argv,
                     env=env_of(database_url, conf, **token))
    await wait_until(lambda: "started" in p.stderr_text() or not p.alive, 30,
                     what=f"{command} to start", describe=p.describe)
    assert p.alive, p.describe()
    p.terminate()
    assert await p.wait(30) == 0, p.describe()


# --- the leak test ----------------------------------------------------------------------------


def dump(database_url: str, folder: Path) -> bytes:
    """Everything the database holds, as bytes."""
    if database_url.startswith("postgresql"):
        try:
            done = subprocess.run(["pg_dump", "--no-owner", database_url],
                                  capture_output=True, timeout=120)
        except FileNotFoundError:
            missing("pg_dump (PostgreSQL's client programs)")
        assert done.returncode == 0, done.stderr
        return done.stdout
    path = Path(database_url.removeprefix("sqlite:///"))
    files = sorted(path.parent.glob(path.name + "*"))  # the file, its -wal and -shm
    assert path in files
    return b"".join(f.read_bytes() for f in files)


async def api_texts(base: str, ids: list[str]) -> list[str]:
    texts: list[str] = []
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        for path in ["/v1/executions?limit=1000", "/v1/workers", "/metrics", "/healthz",
                     *[f"/v1/executions/{i}" for i in ids],
                     *[f"/v1/executions/{i}/history?limit=1000" for i in ids]]:
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text)
            texts.append(response.text)
    return texts


@pytest.mark.slow
async def test_a_secret_never_leaks(
    tmp_path: Path, database_url: str, procs: Processes, echo: EchoServer,
) -> None:
    token = f"leak-token-{uuid.uuid4().hex}"  # from the environment
    key = f"leak-key-{uuid.uuid4().hex}"  # from the secrets file
    secrets = write(tmp_path / "secrets.toml", f'api_key = "{key}"\n')
    dead = free_port()  # a bound origin where nothing listens
    conf = config(tmp_path, echo, dead, secrets)
    env = env_of(database_url, conf, VERACITY_SECRET_API_TOKEN=token,
                 VERACITY_LOG_LEVEL="debug")
    port = free_port()
    started: list[WorkerProcess] = []
    if database_url.startswith("postgresql"):
        started.append(procs.worker(database_url, "server", argv=server_argv(port, "--no-worker"),
                                    env=env))
        started.append(procs.worker(database_url, "worker", env=env))
    else:  # the embedded setup: the server runs the worker
        started.append(procs.worker(database_url, "server", argv=server_argv(port), env=env))
    base = f"http://127.0.0.1:{port}"

    async def healthy() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(f"{base}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    await wait_until(healthy, 30, what="the server", describe=procs.describe)
    submissions = [
        ("test:leak/echo.run", [f"{echo.origin}/echo"]),
        ("test:leak/call.run", ["GET", f"{echo.origin}/ok"]),
        ("test:leak/call.run", ["GET", f"{echo.origin}/status/503"]),
        ("test:leak/call.run", ["DELETE", f"{echo.origin}/refused"]),
        ("test:leak/call.run", ["GET", f"http://127.0.0.1:{dead}/nobody"]),
    ]
    ids: list[str] = []
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        for ffqn, params in submissions:
            response = await client.post("/v1/executions", json={"ffqn": ffqn, "params": params})
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])

        async def all_ended() -> list[dict[str, Any]] | None:
            items = (await client.get("/v1/executions?limit=1000")).json()["items"]
            ended = [e for e in items if e["status"] in TERMINAL]
            return items if len(items) == 6 and len(ended) == 6 else None  # + the scheduled

        items = await wait_until(all_ended, 60, what="every execution to end",
                                 describe=procs.describe)
        # whole values (a list item leaves out large ones, such as an error's traceback)
        items = [(await client.get(f"/v1/executions/{e['id']}")).json() for e in items]
    by_id = {e["id"]: e for e in items}
    echo_run, ok, unavailable, refused, unreachable = (by_id[i] for i in ids)
    assert echo_run["status"] == "failed" and ok["status"] == "completed"
    assert ok["result"] == 200
    assert unavailable["status"] == "completed" and unavailable["result"] == 503
    assert refused["status"] == "failed" and "HttpRefused" in refused["error"]["message"]
    assert unreachable["status"] == "failed" and "ConnectError" in unreachable["error"]["message"]
    [scheduled] = [e for e in items if e["ffqn"] == "test:leak/keep.run"]
    assert scheduled["status"] == "completed"

    texts = await api_texts(base, [e["id"] for e in items])
    outputs = [cli(database_url, env, *args) for args in (
        ["list", "--json"], ["workers", "--json"],
        *(["get", e["id"], "--json"] for e in (echo_run, scheduled)),
        *(["history", e["id"], "--json"] for e in (echo_run, scheduled)))]
    for done in outputs:
        assert done.returncode == 0, (done.args, done.stderr)
    for p in started:
        p.terminate()
    for p in started:
        assert await p.wait(30) == 0, p.describe()
    database = dump(database_url, tmp_path)
    logs = [p.stderr_text() + p.stdout_text() for p in started]

    # it went out: the echo server got both values on every try of every step
    sent = echo.requests("/echo")
    assert len(sent) == 4  # three tries of the failing step, then one more step
    assert {s.headers["authorization"] for s in sent} == {f"Bearer {token}"}
    assert {s.headers["x-api-key"] for s in sent} == {key}
    assert len(echo.requests("/status/503")) == 1 and echo.requests("/refused") == []

    # and it is nowhere else
    for value in (token, key):
        assert value.encode() not in database
        for text in [*texts, *logs, *(d.stdout + d.stderr for d in outputs)]:
            assert value not in text
    # positive controls: each place searched holds the redacted echo, so it was exercised
    assert b"[secret api_token]" in database and b"[secret api_key]" in database
    api = "".join(texts)
    assert "Bearer [secret api_token]" in api and "[secret api_key]" in api
    assert "Bearer [secret api_token]" in "".join(d.stdout for d in outputs)
    all_logs = "".join(logs)
    assert '"level": "debug"' in all_logs  # the debug level was on
    assert "X-Echo-Authorization" in all_logs  # the HTTP library logged the answer's headers
    assert "upstream answered" in all_logs and "[secret api_key]" in all_logs
    assert "Traceback" in all_logs and "ConnectError" in all_logs  # log.exception's
    assert len(echo.requests()) == len(sent) + 2


def test_the_app_module_imports() -> None:
    # the processes above import it by name; a typo there would only show as a timeout
    from tests.worker import http_app
    assert set(http_app.app.workflows) == {"test:leak/echo.run", "test:leak/keep.run",
                                           "test:leak/call.run"}
    assert asyncio.iscoroutinefunction(http_app.echo)
