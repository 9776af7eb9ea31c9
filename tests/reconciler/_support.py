"""Shared pieces of the reconciler tests: configuration for a fake n8n, a rig that starts
runs the way the worker does (claim, then ``external.trigger``), ticks the reconciler, reads
its metrics and checks the truthfulness invariant against the fake's ground truth; and
helpers for real ``veracity server`` processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from veracity._tls import ssl_context
from veracity.adapters.config import ExternalConfig, parse_external
from veracity.adapters.n8n import N8nEngine
from veracity.config import Settings
from veracity.core.states import TERMINAL, Status
from veracity.maintenance.reconciler import ReconcilerMetrics, ReconcilerService, TickResult
from veracity.models import Claim, Execution, HistoryEvent, NewExecution
from veracity.store import Store, token_hash
from veracity.testing.fake_n8n import FakeN8n, RunTruth, Script
from veracity.worker.trigger import trigger

API_KEY = "reconciler-test-key"
EMAIL = "owner@example.com"
PASSWORD = "fake pass 1"
V1, V2 = "1.123", "2.0"

FAST = "shop:n8n/fast.run"
"""An external workflow with a tiny limit: breached a moment after its trigger."""
FAST_LIMIT = 0.3
SLOW = "shop:n8n/slow.run"
"""An external workflow whose limit (an hour) no test reaches."""
CANCELLABLE = "shop:n8n/slow.run-cancellable"
"""Like SLOW, and it may be cancelled."""
WEBHOOK = "fulfil"
DEPLOYMENT = "dep-reconciler"
# the environment of the tests' processes: a worker claims only its deployment's executions
ENV = {"N8N_API_KEY": API_KEY, "N8N_EMAIL": EMAIL, "N8N_PASSWORD": PASSWORD,
       "VERACITY_DEPLOYMENT_ID": DEPLOYMENT}
OWNER = "test-worker"
MAX_PAYLOAD = 4096
TERMINAL_KINDS = frozenset(str(s) for s in TERMINAL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


CLOSED_URL = f"http://127.0.0.1:{free_port()}"
"""A loopback port nothing listens on: callbacks sent there are lost."""


def engine_table(base_url: str, *, timeout: float = 5.0, login: bool = True) -> dict[str, Any]:
    table: dict[str, Any] = {"base_url": base_url, "api_key_env": "N8N_API_KEY",
                             "timeout": timeout}
    if login:
        table |= {"login_email_env": "N8N_EMAIL", "login_password_env": "N8N_PASSWORD"}
    return table


def workflow_tables(fast_limit: str = f"{int(FAST_LIMIT * 1000)}ms") -> list[dict[str, Any]]:
    return [
        {"ffqn": FAST, "engine": "n8n", "webhook": f"/webhook/{WEBHOOK}",
         "max_duration": fast_limit},
        {"ffqn": SLOW, "engine": "n8n", "webhook": f"/webhook/{WEBHOOK}",
         "max_duration": "1h"},
        {"ffqn": CANCELLABLE, "engine": "n8n", "webhook": f"/webhook/{WEBHOOK}",
         "max_duration": "1h"},
    ]


def external_config(base_url: str, public_url: str = CLOSED_URL, *,
                    timeout: float = 5.0, login: bool = True) -> ExternalConfig:
    settings = Settings(public_url=public_url,
                        engines={"n8n": engine_table(base_url, timeout=timeout, login=login)},
                        external_workflow=workflow_tables())
    return parse_external(settings, ENV)


def config_toml(base_url: str, public_url: str, *, fast_limit: str = "300ms",
                timeout: float = 5.0) -> str:
    """The same configuration as a veracity.toml for server processes."""
    lines = [f'public_url = "{public_url}"', "", "[engines.n8n]"]
    for key, value in engine_table(base_url, timeout=timeout).items():
        lines.append(f"{key} = {json.dumps(value)}")
    for wf in workflow_tables(fast_limit):
        lines += ["", "[[external_workflow]]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in wf.items()]
    return "\n".join(lines) + "\n"


def new_fake(version: str = V1, **kw: Any) -> FakeN8n:
    fake = FakeN8n(version=version, api_key=API_KEY, email=EMAIL, password=PASSWORD, **kw)
    # by default a run goes on forever and never calls back
    fake.add_webhook(WEBHOOK, Script.forever(callback="lose"))
    return fake


async def eventually(check: Callable[[], Any], timeout: float = 5.0,
                     interval: float = 0.02, what: str = "condition") -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(interval)


@dataclass
class Started:
    id: uuid.UUID
    run_id: str | None
    outcome: str


@dataclass
class Rig:
    """A store, the fake n8n behind a real adapter, and reconcilers over them."""

    fake: FakeN8n
    base_url: str
    store: Store
    external: ExternalConfig
    engine: N8nEngine
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    started: list[uuid.UUID] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.metrics = ReconcilerMetrics(self.registry)

    # -- the reconciler -------------------------------------------------------------------

    def service(self, **kw: Any) -> ReconcilerService:
        kw.setdefault("metrics", self.metrics)
        return ReconcilerService(self.store, {"n8n": self.engine}, self.external.limits, **kw)

    async def tick(self, **kw: Any) -> TickResult:
        return await self.service(**kw).run_once()

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def engine_errors(self, kind: str) -> float:
        return self.sample("veracity_reconciler_engine_errors_total", kind=kind)

    def all_engine_errors(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for family in self.registry.collect():
            if family.name == "veracity_reconciler_engine_errors":
                for s in family.samples:
                    if s.name.endswith("_total"):
                        out[s.labels["kind"]] = s.value
        return out

    # -- starting runs --------------------------------------------------------------------

    async def submit_claim(self, ffqn: str = SLOW) -> tuple[Execution, Claim]:
        eid = uuid.uuid4()
        await self.store.execution_submit(
            NewExecution(ffqn=ffqn, params=[{"order": str(eid)[:8]}],
                         deployment_id=DEPLOYMENT, id=eid))
        claimed = await self.store.execution_claim(OWNER, [ffqn], limit=1,
                                                   lease_ttl=timedelta(seconds=60))
        assert [e.id for e in claimed] == [eid]
        self.started.append(eid)
        return claimed[0], Claim(eid, OWNER, claimed[0].lease_epoch)

    async def start(self, script: Script | None = None, ffqn: str = SLOW) -> Started:
        """Start one run as the worker does: claim, then trigger through the adapter."""
        execution, claim = await self.submit_claim(ffqn)
        if script is not None:
            self.fake.script_for_execution(str(execution.id), script)
        assert self.external.public_url is not None
        outcome = await trigger(self.store, self.engine, self.external.workflows[ffqn],
                                execution, claim, self.external.public_url)
        runs = self.fake.runs_for_execution(str(execution.id))
        return Started(execution.id, runs[0].run_id if runs else None, outcome)

    async def delegate_only(self, ffqn: str = SLOW) -> uuid.UUID:
        """A worker that crashed between recording the trigger and calling the engine:
        running, delegated, no external id, never flagged by the trigger itself."""
        execution, claim = await self.submit_claim(ffqn)
        done = await self.store.execution_delegate_if_owned(claim, "n8n", token_hash("x"))
        assert done.applied
        return execution.id

    # -- reading --------------------------------------------------------------------------

    async def get(self, execution_id: uuid.UUID) -> Execution:
        e = await self.store.execution_get(execution_id)
        assert e is not None
        return e

    async def history(self, execution_id: uuid.UUID) -> list[HistoryEvent]:
        return await self.store.history_list(execution_id, limit=10_000)

    async def kinds(self, execution_id: uuid.UUID) -> list[str]:
        return [ev.kind for ev in await self.history(execution_id)]

    def truth(self, run_id: str | None) -> RunTruth:
        assert run_id is not None
        return self.fake.truth(run_id)

    async def terminal_times(self) -> dict[str, datetime]:
        """Each started execution that is terminal -> when Veracity recorded it terminal."""
        out: dict[str, datetime] = {}
        for eid in self.started:
            for ev in await self.history(eid):
                if ev.kind in TERMINAL_KINDS:
                    out[str(eid)] = ev.at
                    break
        return out

    async def assert_truthful(self) -> None:
        """No execution terminal in Veracity while its run still goes in the engine, and
        nothing completed without a result delivered by /complete."""
        violations = self.fake.truthful_violations(await self.terminal_times())
        assert violations == [], "\n".join(violations)
        for eid in self.started:
            for ev in await self.history(eid):
                if ev.kind == Status.COMPLETED:
                    assert isinstance(ev.data, dict) and ev.data.get("by") == "callback", ev

    async def terminal_events(self, execution_id: uuid.UUID) -> list[HistoryEvent]:
        return [ev for ev in await self.history(execution_id) if ev.kind in TERMINAL_KINDS]


def callback_token(rig: Rig, run_id: str | None) -> str:
    """The per-execution callback token, as the engine received it in the trigger."""
    body = rig.truth(run_id).trigger_body
    assert isinstance(body, dict)
    token = body["callback"]["token"]
    assert isinstance(token, str)
    return token


async def wait_status(rig: Rig, run_id: str | None, *statuses: str,
                      timeout: float = 5.0) -> RunTruth:
    """Until the fake says the run's status is one of ``statuses``."""

    def check() -> RunTruth | None:
        t = rig.truth(run_id)
        return t if t.status in statuses else None

    found: RunTruth = await eventually(check, timeout=timeout,
                                       what=f"run {run_id} in {statuses}")
    return found


# -- an ASGI recorder in front of the fake --------------------------------------------------


@dataclass(frozen=True)
class Span:
    tag: str
    method: str
    path: str
    start: float
    end: float


class TaggingRecorder:
    """Serves an ASGI app under ``/<tag>/...`` prefixes (each client configured with its own
    prefix in its base_url) and records every request's span, by tag. A span ends when the
    answer starts to go out: before the client can have seen any of it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.spans: list[Span] = []
        self._open: dict[int, Span] = {}
        """Requests under way (their ``end`` is meaningless), by request number."""
        self._count = 0

    def in_flight(self, tag: str) -> dict[int, Span]:
        """The requests of ``tag`` under way now (not answered yet), by request number."""
        return {n: span for n, span in list(self._open.items()) if span.tag == tag}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        match = re.match(r"^/(s\d+)(/.*)$", scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        tag, path = match.group(1), match.group(2)
        scope = dict(scope, path=path, raw_path=path.encode())
        start = time.monotonic()
        ended: list[float] = []
        self._count += 1
        number = self._count
        self._open[number] = Span(tag, scope["method"], path, start, math.inf)

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not ended:
                ended.append(time.monotonic())
                self._open.pop(number, None)  # answered: no longer under way
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            end = ended[0] if ended else time.monotonic()
            self.spans.append(Span(tag, scope["method"], path, start, end))
            self._open.pop(number, None)


@dataclass
class Tagged:
    """A fake n8n served behind a :class:`TaggingRecorder` (fixture ``tagged``): give each
    client ``f"{url}/s<N>"`` as its base_url to tell its requests apart."""

    fake: FakeN8n
    url: str
    recorder: TaggingRecorder

    def rig(self, store: Store, public_url: str = CLOSED_URL) -> Rig:
        """A rig over ``store`` whose adapter reaches the fake untagged (not recorded under
        any tag); close its engine when done."""
        external = external_config(self.url, public_url)
        return Rig(self.fake, self.url, store, external, N8nEngine(external.engines["n8n"]))


# -- server processes -----------------------------------------------------------------------

_found = shutil.which("veracity", path=str(Path(sys.executable).parent))
assert _found is not None, "the veracity console script is not installed in this venv"
VERACITY: str = _found
REPO_ROOT = Path(__file__).resolve().parents[2]


def process_env(database_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VERACITY_", "N8N_")) and k != "PYTHONPATH"}
    env.update({"VERACITY_DATABASE_URL": database_url, "VERACITY_LOG_LEVEL": "info",
                "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)})
    env.update(extra or {})
    return env


@dataclass
class ServerProcess:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    stderr_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for line in self.stderr().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a traceback from a crash would show in the assertion message
            if isinstance(record, dict):
                out.append(record)
        return out

    async def wait_healthy(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1.0, verify=ssl_context()) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n"
                                         f"{self.stderr()}")
                with contextlib.suppress(httpx.TransportError):
                    response = await client.get(f"{self.url}/healthz")
                    if response.status_code == 200:
                        return
                await asyncio.sleep(0.05)
        raise AssertionError(f"{self.name} not healthy within {timeout}s:\n{self.stderr()}")

    async def metrics(self) -> str:
        async with httpx.AsyncClient(timeout=5.0, verify=ssl_context()) as client:
            response = await client.get(f"{self.url}/metrics")
        assert response.status_code == 200, response.text
        return response.text


@contextlib.contextmanager
def server_processes(folder: Path, database_url: str, count: int, *,
                     config_for: Callable[[int, int], str],
                     env: Mapping[str, str] | None = None,
                     args: tuple[str, ...] = ()) -> Iterator[list[ServerProcess]]:
    """Start ``count`` ``veracity server`` processes; ``config_for(index, port)`` gives each
    its veracity.toml. All are killed at the end, whatever happened."""
    servers: list[ServerProcess] = []
    try:
        for i in range(count):
            port = free_port()
            name = f"server{i}"
            config = folder / f"{name}.toml"
            config.write_text(config_for(i, port))
            err_path = folder / f"{name}.err"
            full_env = process_env(database_url, {
                **ENV, "VERACITY_PORT": str(port), "VERACITY_HOST": "127.0.0.1",
                "VERACITY_CONFIG": str(config), **(env or {})})
            with (folder / f"{name}.out").open("wb") as out, err_path.open("wb") as err:
                proc = subprocess.Popen([VERACITY, "server", *args], env=full_env, cwd=folder,
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            servers.append(ServerProcess(name, proc, port, err_path))
        yield servers
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.proc.terminate()
        for server in servers:
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=10)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from Prometheus text (None if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None
