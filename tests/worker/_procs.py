"""Real worker processes for the tests: start, signal, kill, stall, and read their logs.

``WorkerProcess`` runs ``veracity worker`` from this virtualenv against a test database with
the test App (``tests.workflows:app``); its stdout and stderr (JSON log lines) go to files in
the test's tmp_path, so a failing test can show what the worker said. ``Processes`` owns every
process a test starts and ends them all in the fixture's finalizer, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

REPO_ROOT = Path(__file__).resolve().parents[2]
APP = "tests.workflows:app"
DEPLOYMENT = "d-test"
"""The deployment of every test process unless a test says otherwise: a worker claims only
its own deployment's executions (docs/deployments.md), and the test apps differ."""

# Short leases so that expiry-driven tests sleep for seconds, not minutes.
FAST_ENV: dict[str, str] = {
    "VERACITY_LEASE_TTL": "1.5",
    "VERACITY_HEARTBEAT_INTERVAL": "0.3",
    "VERACITY_POLL_INTERVAL": "0.2",
    "VERACITY_SHUTDOWN_GRACE": "5",
}

T = TypeVar("T")


def veracity_bin() -> str:
    """The ``veracity`` script of the interpreter running the tests."""
    found = shutil.which("veracity", path=str(Path(sys.executable).parent))
    if found is None:  # pragma: no cover - the package is installed in the venv
        raise RuntimeError(f"no veracity script beside {sys.executable}")
    return found


def worker_env(database_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: this one without any VERACITY_* or PG* setting of the
    developer's, plus the test database, the test App and short leases."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("VERACITY_", "PG")) and k != "PYTHONPATH"
    }
    env.update({
        "VERACITY_DATABASE_URL": database_url,
        "VERACITY_APP": APP,
        "VERACITY_DEPLOYMENT_ID": DEPLOYMENT,
        "VERACITY_LOG_LEVEL": "info",
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        **FAST_ENV,
    })
    env.update(extra or {})
    return env


class WorkerProcess:
    """One ``veracity worker`` process (or any command, via ``argv``)."""

    def __init__(
        self,
        name: str,
        database_url: str,
        folder: Path,
        *,
        env: Mapping[str, str] | None = None,
        argv: Sequence[str] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.argv = [*prefix, *(argv or [veracity_bin(), "worker"])]
        self.env = worker_env(database_url, env)
        self.folder = folder
        self.stdout_path = folder / f"{name}.stdout"
        self.stderr_path = folder / f"{name}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> WorkerProcess:
        assert self.proc is None, f"{self.name} already started"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.folder, stdin=subprocess.DEVNULL,
                stdout=out, stderr=err,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        assert self.proc is not None, f"{self.name} not started"
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill9(self) -> None:
        """SIGKILL, and reap it: no cleanup of any kind runs in the worker."""
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(timeout=10)

    def stall(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    async def wait(self, timeout: float) -> int:
        """Wait for the process to exit (without blocking the event loop); its exit code."""
        assert self.proc is not None, f"{self.name} not started"
        proc = self.proc
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                await self._dump_tasks()
                raise AssertionError(
                    f"{self.name} (pid {proc.pid}) still running after {timeout}s\n"
                    f"{self.describe()}"
                )
            await asyncio.sleep(0.02)
        return proc.returncode

    async def _dump_tasks(self) -> None:
        """Ask a stuck ``veracity worker`` what each of its tasks waits on (SIGUSR1: one
        ``tasks`` log line, docs/workers.md), so that the failure shows it."""
        if self.argv[-1:] != ["worker"] or self.proc is None or self.proc.poll() is not None:
            return  # not a worker of ours, or gone
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGUSR1)
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            if any(r.get("message") == "tasks" for r in self.log_records()):
                return
            await asyncio.sleep(0.05)

    def cleanup(self) -> None:
        """End the process whatever state it is in (stopped ones are continued first)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    # -- output ---------------------------------------------------------------------------

    def stdout_text(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (other lines are skipped)."""
        out: list[dict[str, Any]] = []
        for line in self.stderr_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    out.append(record)
        return out

    def worker_id(self) -> str | None:
        """The worker id it logged at registration (None before it registered)."""
        for record in self.log_records():
            if record.get("message") == "worker started" and record.get("worker_id"):
                return str(record["worker_id"])
        return None

    async def registered(self, timeout: float = 15) -> str:
        """Wait until it has registered (failing at once if it died); its worker id."""

        def found() -> str | None:
            assert self.alive, self.describe()
            return self.worker_id()

        worker_id = await wait_until(found, timeout, what=f"{self.name} to register",
                                     describe=self.describe)
        assert worker_id is not None
        return worker_id

    def describe(self, tail: int = 40) -> str:
        lines = self.stderr_text().splitlines()[-tail:]
        return (f"--- {self.name} argv={self.argv} rc={self.returncode}\n"
                f"stdout: {self.stdout_text()[-2000:]}\nstderr (last {tail} lines):\n"
                + "\n".join(lines))


class Processes:
    """Starts worker processes for one test and ends them all at teardown."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[WorkerProcess] = []

    def worker(
        self,
        database_url: str,
        name: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
        argv: Sequence[str] | None = None,
        start: bool = True,
    ) -> WorkerProcess:
        proc = WorkerProcess(
            name or f"worker{len(self.started) + 1}", database_url, self.folder,
            env=env, prefix=prefix, argv=argv,
        )
        self.started.append(proc)
        return proc.start() if start else proc

    def describe(self) -> str:
        return "\n".join(p.describe() for p in self.started)

    def cleanup(self) -> None:
        for proc in self.started:
            proc.cleanup()


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float,
    *,
    interval: float = ...,
    what: str = ...,
    describe: Callable[[], str] | None = ...,
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    *,
    interval: float = ...,
    what: str = ...,
    describe: Callable[[], str] | None = ...,
) -> T: ...


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    *,
    interval: float = 0.05,
    what: str = "the condition",
    describe: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy; return that.
    On timeout, fail with ``what`` and whatever ``describe()`` says (e.g. worker logs)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{describe()}" if describe is not None else ""
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what} (last: {value!r}){extra}"
            )
        await asyncio.sleep(interval)
