"""bench.peers' held start (bench/peers/__main__.py, ``held``): the workers of a drain are
started while the harness locks the job table, and the lock is released once each of
them waits for it, so that two workers start draining together. Real processes, a real
PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import pytest
from bench.peers import __main__ as peers
from bench.peers.systems import System

SYSTEM = System("test", "veracity", "SELECT 0", "veracity_executions")

READ_JOBS = """
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute("SELECT count(*) FROM veracity_executions")
"""

READ_ELSEWHERE = """
import sys, time, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute("SELECT count(*) FROM veracity_workers")
    time.sleep(30)
"""


def start(script: str, url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script, url])


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_the_lock_is_released_once_every_worker_waits_for_it(pg_url: str) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with peers.held(SYSTEM, pg_url) as release:
            procs = [start(READ_JOBS, pg_url) for _ in range(2)]
            time.sleep(0.5)
            assert all(p.poll() is None for p in procs), "a reader got past the lock"
            began = time.monotonic()
            assert release(procs)
            assert time.monotonic() - began < peers.HOLD_TIMEOUT
            assert [p.wait(timeout=10) for p in procs] == [0, 0]
    finally:
        stop(procs)


def test_a_worker_that_never_reads_the_table_is_said_so_and_the_lock_released(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers, "HOLD_TIMEOUT", 1.0)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with peers.held(SYSTEM, pg_url) as release:
            procs = [start(READ_JOBS, pg_url), start(READ_ELSEWHERE, pg_url)]
            assert not release(procs)
            assert procs[0].wait(timeout=10) == 0  # released all the same
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            conn.execute("SELECT count(*) FROM veracity_executions")
    finally:
        stop(procs)


def test_local_ports_name_the_connections_of_a_process(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT client_port FROM pg_stat_activity "
                           "WHERE pid = pg_backend_pid()").fetchone()
        assert row is not None
        assert row[0] in peers.local_ports(os.getpid())
