"""Shared pieces of the benchmarks: a free port, a server process, a scratch database."""

from __future__ import annotations

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
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

from veracity._tls import ssl_context

PG_URL = os.environ.get(
    "VERACITY_BENCH_DATABASE_URL",
    os.environ.get("VERACITY_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu(pid: int) -> float:
    """User and system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_cpu_seconds(pid: int) -> float:
    """A PostgreSQL backend's CPU seconds so far, to the nanosecond where the kernel keeps
    ``/proc/PID/schedstat`` (its first field: the time on a CPU; a backend has one thread);
    else ``process_cpu``'s clock ticks (10 ms each, too coarse for a backend's share of a
    drain of a few thousand executions). 0 for a backend that has exited."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:  # none such, or it exited meanwhile
        return process_cpu(pid) if os.path.exists(f"/proc/{pid}/stat") else 0.0


def veracity_bin() -> str:
    found = shutil.which("veracity", path=str(Path(sys.executable).parent))
    if not found:
        raise SystemExit("veracity is not installed in this environment (run make install)")
    return found


@contextmanager
def scratch_pg_database() -> Iterator[str]:
    name = f"veracity_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = PG_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def server(database_url: str, app: str = "veracity.examples.shop:app",
           extra_env: dict[str, str] | None = None,
           pids: list[int] | None = None) -> Iterator[str]:
    """A ``veracity server`` on a free port, yielding its URL (and appending its process
    id to ``pids``, if given)."""
    port = free_port()
    env = dict(os.environ, VERACITY_DATABASE_URL=database_url, VERACITY_APP=app,
               VERACITY_PORT=str(port), VERACITY_LOG_LEVEL="warning", **(extra_env or {}))
    proc = subprocess.Popen([veracity_bin(), "server"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    if pids is not None:
        pids.append(proc.pid)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1, verify=ssl_context()).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise SystemExit(f"server did not start: {err[-2000:]}")
            time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
