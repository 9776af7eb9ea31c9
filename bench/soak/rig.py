"""The soak's parts and what breaks them: a private PostgreSQL cluster (initdb'd on a free
port, never the shared one), the fake n8n served on loopback in this process, one
``veracity server`` (the API, the reconciler and lease recovery, with short intervals) and
several ``veracity worker`` processes; and the injection of each fault of the schedule
(:meth:`Rig.inject`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from tests._pg import TempCluster, free_port

from bench.soak import schedule as sch
from bench.soak.app import MARKS_ENV
from bench.soak.workload import EXTERNAL
from veracity._tls import ssl_context
from veracity.testing.fake_n8n import FakeN8n, serve_in_thread
from veracity.testing.fake_n8n.scripts import CallbackMode

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "soak-n8n-key"
EMAIL = "soak@example.com"
PASSWORD = "soak pass 1"
SECRETS = {"N8N_API_KEY": API_KEY, "N8N_EMAIL": EMAIL, "N8N_PASSWORD": PASSWORD}


@dataclass(frozen=True)
class Settings:
    """The processes' short intervals (docs/workers.md, docs/external.md)."""

    workers: int = 3
    concurrency: int = 16
    lease_ttl: float = 4.0
    heartbeat: float = 1.0
    poll: float = 0.5
    recovery_interval: float = 1.0
    max_attempts: int = 8
    reconciler_interval: float = 2.0
    engine_timeout: float = 3.0
    stop_flag_after: float = 60.0

    def env(self) -> dict[str, str]:
        return {
            "VERACITY_WORKER_CONCURRENCY": str(self.concurrency),
            "VERACITY_LEASE_TTL": str(self.lease_ttl),
            "VERACITY_HEARTBEAT_INTERVAL": str(self.heartbeat),
            "VERACITY_POLL_INTERVAL": str(self.poll),
            "VERACITY_SHUTDOWN_GRACE": "3",
            "VERACITY_RECOVERY_INTERVAL": str(self.recovery_interval),
            "VERACITY_MAX_ATTEMPTS": str(self.max_attempts),
            "VERACITY_RECONCILER_INTERVAL": str(self.reconciler_interval),
            "VERACITY_ENGINE_TIMEOUT": str(self.engine_timeout),
            "VERACITY_STOP_FLAG_AFTER": str(self.stop_flag_after),
        }


def veracity_bin() -> str:
    found = shutil.which("veracity", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("veracity is not installed beside this Python (run make install)")
    return found


def config_toml(engine_url: str, public_url: str, timeout: float) -> str:
    """veracity.toml: the fake n8n as engine ``n8n`` and one external workflow per
    behaviour of bench/soak/workload.py."""
    lines = [
        f"public_url = {json.dumps(public_url)}",
        "",
        "[engines.n8n]",
        f"base_url = {json.dumps(engine_url)}",
        'api_key_env = "N8N_API_KEY"',
        'login_email_env = "N8N_EMAIL"',
        'login_password_env = "N8N_PASSWORD"',
        f"timeout = {timeout}",
    ]
    for ext in EXTERNAL.values():
        lines += ["", "[[external_workflow]]", f"ffqn = {json.dumps(ext.ffqn)}",
                  'engine = "n8n"', f'webhook = "/webhook/{ext.webhook}"',
                  f"max_duration = {json.dumps(ext.max_duration)}"]
    return "\n".join(lines) + "\n"


@dataclass
class Proc:
    """One Veracity process: its role's name, the current process and its generation (a
    killed worker is replaced by the next generation)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0
    stopped: bool = False

    def start(self) -> None:
        self.generation += 1
        base = self.folder / f"{self.name}.{self.generation}"
        with open(f"{base}.out", "wb") as out, open(f"{base}.err", "wb") as err:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.folder,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        self.stopped = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def end(self, timeout: float = 15.0) -> None:
        """SIGTERM (after SIGCONT if stopped), SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        path = self.folder / f"{self.name}.{self.generation}.err"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class FaultRecord:
    """What became of one scheduled fault."""

    fault: sch.Fault
    started: float | None = None
    ended: float | None = None
    outcome: str = "pending"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**self.fault.to_json(), "started": self.started, "ended": self.ended,
                "outcome": self.outcome, "note": self.note}


@dataclass
class Rig:
    folder: Path
    settings: Settings
    say: Callable[[str], None] = print
    cluster: TempCluster | None = None
    fake: FakeN8n | None = None
    engine_url: str = ""
    api_url: str = ""
    server: Proc | None = None
    workers: list[Proc] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    t0: float = 0.0
    _stop_fake: Callable[[], None] | None = None
    _pg_up: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._pg_up.set()  # the database is up but while a pg_restart fault runs

    # -- start and stop -------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        assert self.cluster is not None
        return self.cluster.url

    @property
    def marks_dir(self) -> Path:
        return self.folder / "marks"

    def start(self) -> None:
        self.marks_dir.mkdir(parents=True, exist_ok=True)
        self.say("starting a private PostgreSQL cluster ...")
        self.cluster = TempCluster().start()
        # the fake's server logs (a client that hung up, ...) go to a file, not the report
        handler = logging.FileHandler(self.folder / "fake-n8n.log")
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).addHandler(handler)
            logging.getLogger(name).propagate = False
        self.fake = FakeN8n(version="1.123", api_key=API_KEY, email=EMAIL, password=PASSWORD,
                            tick=0.02)
        for ext in EXTERNAL.values():
            self.fake.add_webhook(ext.webhook, ext.script)
        self.engine_url, self._stop_fake = serve_in_thread(self.fake)
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        config = self.folder / "veracity.toml"
        config.write_text(config_toml(self.engine_url, self.api_url,
                                      self.settings.engine_timeout))
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("VERACITY_", "PG", "N8N_")) and k != "PYTHONPATH"}
        env = {**base, **SECRETS, **self.settings.env(),
               "VERACITY_DATABASE_URL": self.database_url, "VERACITY_CONFIG": str(config),
               "VERACITY_APP": "bench.soak.app:app", "VERACITY_LOG_LEVEL": "info",
               "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
               MARKS_ENV: str(self.marks_dir)}
        server_env = {**env, "VERACITY_PORT": str(port), "VERACITY_HOST": "127.0.0.1"}
        self.server = Proc(sch.SERVER, [veracity_bin(), "server", "--no-worker"], server_env,
                           self.folder)
        self.server.start()
        self._wait_healthy()
        for i in range(self.settings.workers):
            worker = Proc(sch.worker_name(i), [veracity_bin(), "worker"], env, self.folder)
            worker.start()
            self.workers.append(worker)
        self._wait_workers()

    def _wait_healthy(self, timeout: float = 60.0) -> None:
        assert self.server is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.server.alive:
                raise SystemExit(f"the server exited:\n{self.server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"{self.api_url}/healthz", timeout=2, verify=ssl_context())
                if answer.status_code == 200:
                    return
            time.sleep(0.1)
        raise SystemExit(f"the server did not answer within {timeout:g} s:\n"
                         f"{self.server.log_tail()}")

    def _wait_workers(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for worker in self.workers:
                if not worker.alive:
                    raise SystemExit(f"{worker.name} exited:\n{worker.log_tail()}")
            with psycopg.connect(self.database_url) as conn:
                row = conn.execute("SELECT count(*) FROM veracity_workers "
                                   "WHERE stopped_at IS NULL").fetchone()
            if row is not None and row[0] >= len(self.workers):
                return
            time.sleep(0.2)
        raise SystemExit(f"the workers did not register within {timeout:g} s")

    def stop(self) -> None:
        """End every process and the fake (the cluster is removed with the folder)."""
        for proc in [*self.workers, *([self.server] if self.server else [])]:
            proc.end()
        if self._stop_fake is not None:
            self._stop_fake()
            self._stop_fake = None
        if self.cluster is not None:
            self.cluster.stop()

    def reconciler_actions(self) -> dict[str, int]:
        """The reconciler's actions, from the servers' log lines (docs/external.md,
        Telemetry): ``terminate failed_transient``, ``flag no_external_id``, ``stop ok``..."""
        counts: Counter[str] = Counter()
        for path in sorted(self.folder.glob(f"{sch.SERVER}.*.err")):
            for line in path.read_text(errors="replace").splitlines():
                if '"domain": "reconciler"' not in line:
                    continue
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    action = record.get("action")
                    if action:
                        detail = (record.get("status") or record.get("flag_kind")
                                  or record.get("stop") or "")
                        counts[f"{action} {detail}".strip()] += 1
        return dict(sorted(counts.items()))

    def dump(self, path: Path) -> None:
        """The database as SQL (pg_dump), to study a violation after the cluster is gone."""
        assert self.cluster is not None
        subprocess.run([str(self.cluster.bin_dir / "pg_dump"), "--file", str(path),
                        self.database_url], check=False, timeout=300,
                       stdin=subprocess.DEVNULL, capture_output=True)

    def processes(self) -> list[Proc]:
        return [*([self.server] if self.server else []), *self.workers]

    # -- faults -----------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def inject(self, record: FaultRecord) -> None:
        """Carry one fault out, from its start to its end (restoring what it broke)."""
        fault = record.fault
        record.started = round(self.now(), 2)
        try:
            handler = getattr(self, f"_fault_{fault.kind}")
            record.outcome = "injected"
            note = await handler(fault)
            record.note = note or ""
        except Exception as exc:
            record.outcome = "failed"
            record.note = f"{type(exc).__name__}: {exc}"
            self.say(f"  fault {fault.kind} on {fault.target} failed: {record.note}")
        finally:
            record.ended = round(self.now(), 2)

    def _worker(self, name: str) -> Proc:
        for worker in self.workers:
            if worker.name == name:
                return worker
        raise ValueError(f"no worker {name!r}")

    async def _fault_worker_kill(self, fault: sch.Fault) -> str:
        worker = self._worker(fault.target)
        pid = worker.pid
        worker.signal(signal.SIGKILL)
        assert worker.proc is not None
        await asyncio.to_thread(worker.proc.wait, 10)
        await asyncio.sleep(fault.seconds)
        worker.start()
        return f"killed pid {pid}; pid {worker.pid} started"

    async def _fault_worker_stop(self, fault: sch.Fault) -> str:
        worker = self._worker(fault.target)
        worker.signal(signal.SIGSTOP)
        worker.stopped = True
        try:
            await asyncio.sleep(fault.seconds)
        finally:
            worker.signal(signal.SIGCONT)
            worker.stopped = False
        return f"pid {worker.pid} stopped"

    async def _fault_db_terminate(self, fault: sch.Fault) -> str:
        """Every connection of the target process ends. It waits for the database to be up
        (a restart may take longer than its outage) and for the process to hold a
        connection (a worker just started may not have one yet), each for a few seconds."""
        proc = self.server if fault.target == sch.SERVER else self._worker(fault.target)
        assert proc is not None
        await asyncio.wait_for(self._pg_up.wait(), timeout=60)
        deadline = time.monotonic() + 10
        while True:
            pid = proc.pid
            ended = await asyncio.to_thread(terminate_connections, self.database_url,
                                            tcp_ports_of(pid))
            if ended or time.monotonic() > deadline:
                return f"{ended} connections of pid {pid} terminated"
            await asyncio.sleep(0.5)

    async def _fault_pg_restart(self, fault: sch.Fault) -> str:
        assert self.cluster is not None
        self._pg_up.clear()
        try:
            await asyncio.to_thread(self.cluster.halt)
            try:
                await asyncio.sleep(fault.seconds)
            finally:
                await asyncio.to_thread(self.cluster.resume)
        finally:
            self._pg_up.set()
        return ""

    async def _fault_engine_crash(self, fault: sch.Fault) -> str:
        assert self.fake is not None
        going = sum(1 for t in self.fake.truths() if t.going)
        self.fake.kill()
        try:
            await asyncio.sleep(fault.seconds)
        finally:
            self.fake.start(starting_for=fault.param or 0.0)
        return f"{going} runs going when it died"

    async def _fault_engine_hang(self, fault: sch.Fault) -> str:
        assert self.fake is not None
        self.fake.latency = fault.param or 0.0
        try:
            await asyncio.sleep(fault.seconds)
        finally:
            self.fake.latency = 0.0
        return ""

    async def _fault_engine_5xx(self, fault: sch.Fault) -> str:
        status = int(fault.param or 500)
        return await self._for_going_runs(
            fault, lambda fake, run: fake.control(run, get_error=status),
            lambda fake, run: fake.control(run, get_error=None), only_going=False)

    async def _fault_callbacks_lose(self, fault: sch.Fault) -> str:
        return await self._callbacks(fault, "lose")

    async def _fault_callbacks_duplicate(self, fault: sch.Fault) -> str:
        return await self._callbacks(fault, "duplicate")

    async def _callbacks(self, fault: sch.Fault, mode: CallbackMode) -> str:
        assert self.fake is not None
        by_path = {ext.webhook: ext.script.callback for ext in EXTERNAL.values()}
        paths = {t.run_id: t.path for t in self.fake.truths()}

        def restore(fake: FakeN8n, run: str) -> None:
            fake.control(run, callback=by_path.get(paths.get(run, ""), "once"))

        return await self._for_going_runs(
            fault, lambda fake, run: fake.control(run, callback=mode), restore)

    async def _for_going_runs(self, fault: sch.Fault, apply: Callable[[FakeN8n, str], None],
                              undo: Callable[[FakeN8n, str], None],
                              only_going: bool = True) -> str:
        """Apply a misbehaviour to every run going, and to those that start, for the
        fault's length; then undo it on those still going (``only_going``: a lost callback
        of a run that ended is lost) or on all of them (an engine answering 5xx again
        answers normally for every run)."""
        fake = self.fake
        assert fake is not None
        touched: set[str] = set()
        deadline = time.monotonic() + fault.seconds
        while time.monotonic() < deadline:
            for t in fake.truths():
                if t.going and t.run_id not in touched:
                    apply(fake, t.run_id)
                    touched.add(t.run_id)
            await asyncio.sleep(0.2)
        for run in touched:
            if not only_going or fake.truth(run).going:
                undo(fake, run)
        return f"{len(touched)} runs"

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter[str]] = {kind: Counter() for kind in sch.KINDS}
        for record in self.faults:
            out[record.fault.kind][record.outcome] += 1
        return {kind: dict(c) for kind, c in out.items()}

    # -- restoring everything for the drain -----------------------------------------------

    def restore(self) -> list[str]:
        """Whatever a fault left broken is mended: every worker running, the database and
        the engine up and prompt."""
        done: list[str] = []
        for worker in self.workers:
            if worker.stopped:
                worker.signal(signal.SIGCONT)
                worker.stopped = False
                done.append(f"{worker.name} continued")
            if not worker.alive:
                worker.start()
                done.append(f"{worker.name} restarted")
        assert self.fake is not None
        if self.fake.down:
            self.fake.start()
            done.append("engine started")
        self.fake.latency = 0.0
        return done


def terminate_connections(url: str, ports: set[int]) -> int:
    """pg_terminate_backend on every connection to the database at ``url`` whose client
    port is one of ``ports``; how many."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
        mine = [pid for pid, port in rows if port in ports]
        for pid in mine:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return len(mine)


def tcp_ports_of(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets (its database connections' client ports,
    as pg_stat_activity shows them), from /proc."""
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports
