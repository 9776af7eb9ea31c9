"""`veracity migrate` run by several processes at once, on both backends."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from tests._pg import create_database, drop_database, with_database
from veracity.store._sql import load_migrations

VERACITY = shutil.which("veracity", path=str(Path(sys.executable).parent))


def _run_concurrently(url: str, cwd: Path, n: int = 4) -> list[subprocess.CompletedProcess[str]]:
    assert VERACITY is not None
    env = dict(os.environ, VERACITY_DATABASE_URL=url)
    env.pop("VERACITY_APP", None)
    procs = [
        subprocess.Popen([VERACITY, "migrate", "--json"], env=env, cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


ALL_VERSIONS = [m.version for m in load_migrations("veracity.store.sqlite")]


def _check(results: list[subprocess.CompletedProcess[str]]) -> None:
    import json

    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    applied = [json.loads(r.stdout)["applied"] for r in results]
    # exactly one process applied the migrations; the others found them done
    assert sorted(applied, key=len)[-1] == ALL_VERSIONS
    assert sum(1 for a in applied if a) == 1


def test_concurrent_migrate_postgresql(pg_server_url, tmp_path):
    name = f"veracity_m_{uuid.uuid4().hex[:10]}"
    create_database(pg_server_url, name)
    try:
        url = with_database(pg_server_url, name)
        _check(_run_concurrently(url, tmp_path))
        with psycopg.connect(url) as conn:
            versions = conn.execute("SELECT version FROM veracity_migrations").fetchall()
            assert versions == [(v,) for v in ALL_VERSIONS]
            tables = conn.execute(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_name IN ('veracity_executions', 'veracity_history')"
            ).fetchone()
            assert tables == (2,)
    finally:
        drop_database(pg_server_url, name)


def test_concurrent_migrate_sqlite(tmp_path):
    path = tmp_path / "fresh.db"
    _check(_run_concurrently(f"sqlite:///{path}", tmp_path))
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM veracity_migrations").fetchall() == [
            (v,) for v in ALL_VERSIONS
        ]
    conn.close()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_migrate_twice_is_a_no_op(backend, pg_url, tmp_path):
    url = pg_url if backend == "postgresql" else f"sqlite:///{tmp_path / 'x.db'}"
    first = _run_concurrently(url, tmp_path, n=1)[0]
    second = _run_concurrently(url, tmp_path, n=1)[0]
    assert first.returncode == second.returncode == 0
    assert '"applied": []' in second.stdout


def test_both_backends_have_the_same_numbered_migrations():
    """The same number means the same change on every backend."""
    pg = [(m.version, m.name) for m in load_migrations("veracity.store.postgres")]
    lite = [(m.version, m.name) for m in load_migrations("veracity.store.sqlite")]
    assert pg == lite
    assert [v for v, _ in pg] == list(range(1, len(pg) + 1))
