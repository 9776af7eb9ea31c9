"""Start-up: ``import veracity``, ``veracity --version``, and how soon a ``veracity worker``
claims its first execution.

- ``import veracity``: the import alone, timed inside a fresh interpreter
  (``time.perf_counter`` around the import statement), and the wall time of the whole
  ``python -c "import veracity"`` process; median of ``--runs``.
- ``veracity --version``: the wall time of the console script, spawn to exit; median.
- first claim: one pending execution of the example shop's ``shop:mail/send.run`` waits
  in a migrated database; ``veracity worker`` is started, and the time from its spawn
  (this host's clock) to the execution's ``running`` event (the database's clock, the
  same host's) is the first claim; to its ``completed`` event, the first completion. The
  worker is then stopped (SIGTERM) and the next run starts a new one. PostgreSQL (a scratch
  database) and SQLite; median and worst of ``--runs``.

Every process runs as on an installed system: with Python's bytecode cache, which pip
writes at install. ``PYTHONDONTWRITEBYTECODE`` (set on some machines, this one included)
is cleared for them, and one untimed run of each kind comes first, so no timed run
compiles a module (compiling made a worker's first claim 896 ms instead of 352 ms here).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

from bench._util import scratch_pg_database, veracity_bin

DEPLOYMENT = "bench-startup"
FFQN = "shop:mail/send.run"


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.0f} ms, worst {max(values) * 1000:.0f} ms"


def cached_env(**extra: str) -> dict[str, str]:
    """The environment of a timed process: bytecode cached, as on an installed system."""
    env = dict(os.environ, **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def import_times(runs: int) -> tuple[list[float], list[float]]:
    code = "import time; t = time.perf_counter(); import veracity; print(time.perf_counter() - t)"
    inside, whole = [], []
    for run in range(runs + 1):  # the first, untimed, fills the bytecode cache
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True, env=cached_env()).stdout
        if run:
            whole.append(time.perf_counter() - started)
            inside.append(float(out))
    return inside, whole


def version_times(runs: int) -> list[float]:
    out = []
    for run in range(runs + 1):  # the first, untimed, fills the bytecode cache
        started = time.perf_counter()
        subprocess.run([veracity_bin(), "--version"], check=True, capture_output=True,
                       env=cached_env())
        if run:
            out.append(time.perf_counter() - started)
    return out


async def _pending(url: str) -> uuid.UUID:
    from veracity.models import NewExecution
    from veracity.store import open_store

    store = await open_store(url)
    try:
        await store.migrate()
        ident = uuid.uuid4()
        await store.execution_submit(NewExecution(
            ffqn=FFQN, params=["a@example.com", "hi"], deployment_id=DEPLOYMENT, id=ident))
        return ident
    finally:
        await store.close()


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _events(url: str, ident: uuid.UUID, timeout: float,
                  pid: int) -> tuple[dict[str, datetime], float]:
    from veracity.store import open_store

    store = await open_store(url)
    cpu = -1.0
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kinds = {e.kind: e.at for e in await store.history_list(ident)}
            if "running" in kinds and cpu < 0:
                cpu = _cpu_seconds(pid)  # an upper bound: read within ~10 ms of the claim
            if "completed" in kinds:
                return kinds, cpu
            await asyncio.sleep(0.01)
        raise SystemExit(f"the worker did not complete {ident} within {timeout} s")
    finally:
        await store.close()


def first_claim(url: str, folder: Path) -> tuple[float, float, float]:
    ident = asyncio.run(_pending(url))
    env = cached_env(VERACITY_DATABASE_URL=url, VERACITY_APP="veracity.examples.shop:app",
                     VERACITY_DEPLOYMENT_ID=DEPLOYMENT, VERACITY_LOG_LEVEL="warning")
    spawned = time.time()
    worker = subprocess.Popen([veracity_bin(), "worker"], env=env, cwd=folder,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        events, cpu = asyncio.run(_events(url, ident, 60, worker.pid))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    return (events["running"].timestamp() - spawned,
            events["completed"].timestamp() - spawned, cpu)


def worker_times(url: str, runs: int, folder: Path
                 ) -> tuple[list[float], list[float], list[float]]:
    claims, completions, cpus = [], [], []
    first_claim(url, folder)  # untimed: fills the bytecode cache
    for _ in range(runs):
        claim, completion, cpu = first_claim(url, folder)
        claims.append(claim)
        completions.append(completion)
        cpus.append(cpu)
    return claims, completions, cpus


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"start-up (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: on a "
          "busy machine wall times grow, CPU times much less):")
    inside, whole = import_times(args.runs)
    print(f"import veracity: {_ms(inside)} (the import alone; target < 150 ms); whole "
          f"process {_ms(whole)}")
    print(f"veracity --version: {_ms(version_times(args.runs))} (target < 300 ms)")
    with tempfile.TemporaryDirectory() as folder, scratch_pg_database() as url:
        claims, completions, cpus = worker_times(url, args.runs, Path(folder))
        print(f"veracity worker, PostgreSQL: first claim {_ms(claims)} after its start "
              f"(target < 500 ms), the worker's CPU by then {_ms(cpus)}; first completion "
              f"{_ms(completions)}")
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/veracity.db"
        claims, completions, cpus = worker_times(url, args.runs, Path(folder))
        print(f"veracity worker, SQLite: first claim {_ms(claims)} after its start, the "
              f"worker's CPU by then {_ms(cpus)}; first completion {_ms(completions)}")
    print(f"(load average after: {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
