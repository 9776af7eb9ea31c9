"""``veracity server`` as a real process on a loopback port: it migrates at start, serves
the API over real HTTP, logs JSON, and stops cleanly (exit 0) on SIGTERM and SIGINT."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import stable
from tests.conftest import run_async
from tests.worker._procs import DEPLOYMENT, Processes, wait_until
from veracity._tls import ssl_context

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
        with httpx.Client(timeout=1.0, verify=ssl_context()) as client:
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
def server_process(tmp_path: Path, env: dict[str, str], port: int,
                   args: Sequence[str] = ()) -> Iterator[Server]:
    out, err = tmp_path / "server.out", tmp_path / "server.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([VERACITY, "server", *args], env=env, cwd=tmp_path,
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
            assert bad.status_code == 422
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


# -- the server's own worker and its lease recovery, with the test App -------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_APP = "tests.workflows:app"


def app_env(database_url: str, port: int, **extra: str) -> dict[str, str]:
    """The server's environment with the test App (importable from the repository root), in
    the deployment of the tests' worker processes (tests.worker._procs)."""
    return server_env(database_url, port, **{"VERACITY_APP": TEST_APP,
                                             "PYTHONPATH": str(REPO_ROOT),
                                             "VERACITY_DEPLOYMENT_ID": DEPLOYMENT, **extra})


def wait_for(check: Callable[[], Any], timeout: float, what: str,
             describe: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            extra = f"\n{describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what} "
                                 f"(last: {got!r}){extra}")
        time.sleep(0.05)


def test_sqlite_server_runs_executions_with_its_in_process_worker(tmp_path: Path) -> None:
    """``veracity server`` on SQLite, without --worker/--no-worker: the embedded setup. It
    runs what is submitted over HTTP with a worker in its own process."""
    database_url = f"sqlite:///{tmp_path}/embedded.db"  # brand-new: migrated at start
    port = free_port()
    with server_process(tmp_path, app_env(database_url, port), port) as server:
        server.wait_healthy()
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            value = {"hello": ["world", 1, None], "pid": server.proc.pid}
            echo = client.post("/v1/executions",
                               json={"ffqn": "test:echo/run.fn", "params": [value]})
            ticker = client.post("/v1/executions",
                                 json={"ffqn": "test:ticker/tick.run", "params": [5]})
            assert echo.status_code == 201 and ticker.status_code == 201, (echo, ticker)

            def ended(ident: str) -> dict[str, Any] | None:
                body: dict[str, Any] = client.get(f"/v1/executions/{ident}").json()
                return body if body["status"] in ("completed", "failed") else None

            echoed = wait_for(lambda: ended(echo.json()["id"]), 10, "the echo to end",
                              server.stderr)
            ticked = wait_for(lambda: ended(ticker.json()["id"]), 10, "the ticker to end",
                              server.stderr)
            assert (echoed["status"], echoed["result"]) == ("completed", value), echoed
            assert (ticked["status"], ticked["result"]) == ("completed", sum(range(5))), ticked
            assert echoed["attempt"] == 1 and echoed["lease_owner"] is None

            # the one worker that ran them is the server's own (its pid), and is live
            workers = client.get("/v1/workers").json()["items"]
            assert [(w["pid"], w["live"]) for w in workers] == [(server.proc.pid, True)], workers
            for body in (echoed, ticked):
                items = client.get(f"/v1/executions/{body['id']}/history").json()["items"]
                runners = [e["data"]["owner"] for e in items if e["kind"] == "running"]
                assert runners == [workers[0]["id"]], items
                assert items[-1]["kind"] == "completed", items
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=STOP_TIMEOUT) == 0, server.stderr()
    records = server.log_lines()
    started = next(r for r in records if r.get("message") == "started")
    assert started["worker"] == workers[0]["id"], started
    assert "Traceback" not in server.stderr()


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_server_recovers_the_execution_of_a_killed_worker(
    tmp_path: Path, database_url: str, procs: Processes
) -> None:
    """Lease recovery wired into ``veracity server`` (no test calls ``run_once``): a worker
    killed with -9 mid-run leaves an expired lease; the server's recovery, every 0.5 s, puts
    the execution back to pending (attempt 2) and a second worker finishes it from its
    checkpoints."""
    marks = tmp_path / "marks.txt"
    n_steps = 6
    port = free_port()
    env = app_env(database_url, port, VERACITY_RECOVERY_INTERVAL="0.5")
    with server_process(tmp_path, env, port, ["--no-worker"]) as server:
        await asyncio.to_thread(server.wait_healthy)
        a = procs.worker(database_url, "A")  # lease TTL 1.5 s (tests.worker._procs)
        a_id = await a.registered()
        async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as client:
            created = await client.post("/v1/executions", json={
                "ffqn": "test:steps/run.fn", "params": [str(marks), n_steps, 0.2]})
            assert created.status_code == 201, created.text
            ident = created.json()["id"]
            lines = [f"{ident}:{i}" for i in range(n_steps)]

            def steps_done() -> int:
                return len(marks.read_text().splitlines()) if marks.exists() else 0

            await wait_until(lambda: steps_done() >= 2, 15, what="two steps",
                             describe=procs.describe)
            a.kill9()
            at_kill = steps_done()
            assert at_kill < n_steps, "A finished before it was killed"

            async def get() -> dict[str, Any]:
                body: dict[str, Any] = (await client.get(f"/v1/executions/{ident}")).json()
                return body

            async def recovered() -> dict[str, Any] | None:
                body = await get()
                return body if body["status"] != "running" else None

            # nobody else runs it: only the server's recovery can move it
            back = await wait_until(recovered, 10, what="the server to recover it",
                                    describe=lambda: server.stderr()[-3000:])
            assert back["status"] == "pending" and back["attempt"] == 2, back
            assert back["lease_owner"] is None, back

            b = procs.worker(database_url, "B")
            b_id = await b.registered()

            async def completed() -> dict[str, Any] | None:
                body = await get()
                return body if body["status"] == "completed" else None

            done = await wait_until(completed, 15, what="B to finish it",
                                    describe=procs.describe)
            assert done["result"] == lines and done["attempt"] == 2, done
            items = (await client.get(f"/v1/executions/{ident}/history")).json()["items"]
            expired = [e for e in items if e["kind"] == "pending"
                       and e["data"].get("reason") == "lease expired"]
            assert len(expired) == 1 and expired[0]["data"]["owner"] == a_id, items
            assert [e["data"]["owner"] for e in items if e["kind"] == "running"] == [a_id, b_id]
            # resumed from A's checkpoints: B ran only the steps A had not checkpointed
            counts = marks.read_text().splitlines()
            assert all(counts.count(line) in (1, 2) for line in lines), counts
            assert sum(counts.count(line) - 1 for line in lines) <= 1, counts
            metrics = (await client.get("/metrics")).text
            assert 'veracity_recovery_actions_total{action="retry"} 1.0' in metrics, metrics
        b.terminate()
        assert await b.wait(10) == 0, b.describe()
        server.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.proc.wait, STOP_TIMEOUT) == 0, server.stderr()
    said = [r for r in server.log_lines() if r.get("logger") == "veracity.recovery"
            and r.get("execution_id") == ident]
    assert [(r["message"], r["previous_owner"], r["attempt"]) for r in said] == [
        ("lease expired: retry", a_id, 2)], said
    records = server.log_lines()
    started = next(r for r in records if r.get("message") == "started")
    assert started["worker"] is None, started  # --no-worker: it ran nothing itself


def _drip(port: int, data: bytes) -> socket.socket:
    """A client that opens a connection and sends only part of a request."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    return sock


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""  # the server closed it without an answer
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_slow_clients_are_cut_off_and_connections_are_bounded(tmp_path: Path) -> None:
    """Dripping headers or a body, or sending nothing at all, does not hold a connection
    past server.read_timeout; connections beyond server.max_connections are answered 503
    at once; a normal request is served meanwhile (docs/operations.md)."""
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path}/v.db", port, VERACITY_READ_TIMEOUT="1",
                     VERACITY_MAX_CONNECTIONS="8")
    with server_process(tmp_path, env, port, ["--no-worker"]) as server:
        server.wait_healthy()
        silent = _drip(port, b"")
        headers = _drip(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        body = _drip(port, b"POST /v1/executions HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        with httpx.Client(base_url=server.url, timeout=5) as client:
            assert client.get("/healthz").status_code == 200  # served meanwhile
        for sock in (silent, headers, body):
            assert _closed_by_server(sock, 5), "a slow client kept its connection"
            sock.close()
        # up to the bound: served; beyond it: answered 503 at once, while the held ones
        # are cut off later
        held = [_drip(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n") for _ in range(7)]
        try:
            with httpx.Client(base_url=server.url, timeout=5) as client:
                assert client.get("/healthz").status_code == 200  # the 8th connection
            held.append(_drip(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"))
            with httpx.Client(base_url=server.url, timeout=5) as client:
                response = client.get("/healthz")  # the 9th
            assert response.status_code == 503
        finally:
            for sock in held:
                sock.close()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            assert wait_for_status(client, "/healthz", 200)
        assert any("did not arrive within 1 s" in line.get("message", "")
                   for line in server.log_lines())


def wait_for_status(client: httpx.Client, path: str, status: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(path).status_code == status:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("var", "value"), [
    ("VERACITY_READ_TIMEOUT", "0"), ("VERACITY_READ_TIMEOUT", "2h"),
    ("VERACITY_READ_TIMEOUT", "soon"), ("VERACITY_MAX_CONNECTIONS", "0"),
    ("VERACITY_MAX_CONNECTIONS", "1000001"),
])
def test_connection_settings_out_of_range_stop_the_server(
    tmp_path: Path, var: str, value: str
) -> None:
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path}/v.db", port, **{var: value})
    result = subprocess.run([VERACITY, "server"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode != 0
    assert var in result.stderr, result.stderr
    assert not (tmp_path / "v.db").exists()  # nothing written


def test_a_second_server_on_one_sqlite_file_refuses_to_start(tmp_path: Path) -> None:
    first_port, second_port = free_port(), free_port()
    url = f"sqlite:///{tmp_path}/v.db"
    with server_process(tmp_path, server_env(url, first_port), first_port,
                        ["--no-worker"]) as first:
        first.wait_healthy()
        result = subprocess.run([VERACITY, "server"], env=server_env(url, second_port),
                                cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert result.returncode == 1, result.stderr
        assert (f"error: another veracity server (pid {first.proc.pid}) is already serving "
                f"{tmp_path}/v.db") in result.stderr
        assert port_is_free(second_port)
        with httpx.Client(timeout=5) as client:
            assert client.get(f"{first.url}/healthz").status_code == 200


def test_a_database_that_does_not_answer_stops_the_start_in_one_line(tmp_path: Path) -> None:
    """The server checks its database before it binds its port: one that refuses the
    connection is one `error:` line naming it (password hidden) and exit 1, no traceback
    (uvicorn's own start failure would exit 3 with one)."""
    port = free_port()
    url = "postgresql://postgres:secret@127.0.0.1:1/nowhere"
    result = subprocess.run([VERACITY, "server", "--no-worker"], env=server_env(url, port),
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: the database at postgresql://postgres:***@127.0.0.1:1/"
                               "nowhere does not answer: connection failed"), lines
    assert "secret" not in result.stderr and port_is_free(port)


def test_a_port_in_use_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """The port is bound first: one in use is one `error:` line and exit 1, with no
    traceback, and neither the database file nor the server's lock beside it made."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = subprocess.run([VERACITY, "server", "--no-worker"],
                                env=server_env(f"sqlite:///{tmp_path}/v.db", port),
                                cwd=tmp_path, capture_output=True, text=True, timeout=30)
    finally:
        holder.close()
    assert result.returncode == 1, result
    assert result.stderr == (f"error: cannot listen on 127.0.0.1:{port}: Address already in "
                             "use (set --port / VERACITY_PORT, or --host / VERACITY_HOST)\n")
    assert list(tmp_path.iterdir()) == []


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_a_server_on_an_ipv6_address_serves_and_says_its_url(tmp_path: Path) -> None:
    """The port is bound by the server itself (to refuse one in use before anything is
    written): an IPv6 host works as before, and the URL it prints has the address in
    brackets, as a URL needs."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    env = server_env(f"sqlite:///{tmp_path}/v.db", port, VERACITY_HOST="::1")
    with server_process(tmp_path, env, port, ["--no-worker"]) as served:
        deadline = time.monotonic() + 20
        while "Veracity is serving" not in served.stdout() and time.monotonic() < deadline:
            assert served.proc.poll() is None, served.stderr()
            time.sleep(0.05)
        assert served.stdout().startswith(f"Veracity is serving http://[::1]:{port}  "), \
            served.stdout()
        assert httpx.get(f"http://[::1]:{port}/healthz", timeout=5).status_code == 200


def test_sqlite_in_process_worker_learns_of_requests_and_new_work_at_once(
    tmp_path: Path,
) -> None:
    """On SQLite there are no notifications: the server's own worker hears of a pause or a
    cancel from the API in its own process (not at its next heartbeat, 60 s here), and of
    work it made claimable itself (children, a parent woken by its child) without waiting
    for its next poll (30 s here)."""
    database_url = f"sqlite:///{tmp_path}/embedded.db"
    port = free_port()
    slow = {"VERACITY_LEASE_TTL": "240", "VERACITY_HEARTBEAT_INTERVAL": "60",
            "VERACITY_POLL_INTERVAL": "30"}
    with server_process(tmp_path, app_env(database_url, port, **slow), port) as server:
        server.wait_healthy()
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            def status(ident: str) -> str:
                return str(client.get(f"/v1/executions/{ident}").json()["status"])

            def submitted(ffqn: str, params: list[Any]) -> str:
                response = client.post("/v1/executions", json={"ffqn": ffqn,
                                                               "params": params})
                assert response.status_code == 201, response.text
                return str(response.json()["id"])

            # a parent whose children run and wake it: several hops, each claimed at once
            parent = submitted("test:parent/run.fn", [[1, 2, 3]])
            wait_for(lambda: status(parent) == "completed", 15, "the parent to complete",
                     server.stderr)
            called = submitted("test:call/run.fn", ["x"])
            wait_for(lambda: status(called) == "completed", 15, "the caller to complete",
                     server.stderr)

            ticking = [submitted("test:ticker/tick.run-cancellable", [100_000])
                       for _ in range(2)]
            for ident in ticking:
                wait_for(functools.partial(lambda i: status(i) == "running", ident), 15,
                         "a run", server.stderr)
            assert client.put(f"/v1/executions/{ticking[0]}/pause").status_code == 200
            assert client.put(f"/v1/executions/{ticking[1]}/cancel").status_code == 200
            wait_for(lambda: status(ticking[0]) == "paused", 15, "the pause to park",
                     server.stderr)
            wait_for(lambda: status(ticking[1]) == "cancelled", 15, "the cancel to stop it",
                     server.stderr)
