"""A bad ``[[cron]]`` entry stops ``veracity server`` at start: exit 1, one line naming the
entry and what is wrong, no traceback, the port never bound, nothing written to the
database (an SQLite file is not even created; a PostgreSQL database is left unmigrated).
``veracity crons`` refuses the same configuration the same way."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests._pg import create_database, drop_database, with_database
from tests.cron._support import MAIL, cron_toml
from tests.test_server import VERACITY, free_port, port_is_free, server_env, server_process

pytestmark = pytest.mark.timeout(120)

GOOD = {"name": "worker_reconcile", "ffqn": MAIL, "schedule": "* * * * *",
        "params": ["ops@example.com", "tick"]}


def bad(**changes: Any) -> dict[str, Any]:
    entry = {**GOOD, **changes}
    return {k: v for k, v in entry.items() if v is not None}


CASES: list[tuple[str, str, str]] = [
    ("bad-expression", cron_toml(bad(schedule="61 * * * *")),
     "error: cron[worker_reconcile]: schedule \"61 * * * *\": minute '61' is not valid "
     "(expected 0-59; croniter: "),
    ("seconds-last", cron_toml(bad(schedule="* * * * * 61")),
     "error: cron[worker_reconcile]: schedule \"* * * * * 61\": day of week '61' is not "
     "valid"),
    ("too-many-fields", cron_toml(bad(schedule="0 0 1 1 * 0 2030")),
     "error: cron[worker_reconcile]: schedule \"0 0 1 1 * 0 2030\": has 7 fields: expected 5"),
    ("unknown-workflow", cron_toml(bad(ffqn="shop:nothing/here.run")),
     "error: cron[worker_reconcile]: ffqn \"shop:nothing/here.run\": unknown workflow: "
     "neither registered by the app nor an [[external_workflow]] (known: "),
    ("unknown-timezone", cron_toml(bad(timezone="Mars/Olympus_Mons")),
     "error: cron[worker_reconcile]: timezone \"Mars/Olympus_Mons\": unknown time zone"),
    ("duplicate-name", cron_toml(GOOD, bad(schedule="0 * * * *")),
     "error: cron[worker_reconcile]: the name is taken by cron #1"),
    ("params-not-a-list", cron_toml(bad(params="ops@example.com")),
     "error: cron[worker_reconcile]: params must be a list"),
    ("unknown-key", cron_toml(bad(retries=3)),
     "error: cron[worker_reconcile]: unknown key retries (an entry has catch_up, ffqn, name, "
     "params, schedule, timezone)"),
    ("no-name", cron_toml(bad(name=None)), "error: cron #1: name is required"),
    ("catch-up-not-bool", cron_toml(bad(catch_up="yes")),
     "error: cron[worker_reconcile]: catch_up must be true or false"),
    ("params-do-not-fit", cron_toml(bad(params=["ops@example.com"])),
     "error: cron[worker_reconcile]: params do not fit workflow shop:mail/send.run: it takes "
     "exactly 2 params (to, subject); got 1: missing subject"),
    ("not-an-array", '[cron]\nname = "x"\n', "error: veracity.toml:1: cron: Input should be "
     "a valid list"),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database nothing has touched: an SQLite path with no file, or a PostgreSQL
    database with no tables."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/v.db"
        return
    server = request.getfixturevalue("pg_server_url")
    name = f"veracity_empty_{uuid.uuid4().hex[:12]}"
    create_database(server, name)
    try:
        yield with_database(server, name)
    finally:
        drop_database(server, name)


def untouched(url: str, tmp_path: Path) -> bool:
    if url.startswith("sqlite:"):
        return not (tmp_path / "v.db").exists()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM information_schema.tables "
                           "WHERE table_schema = 'public'").fetchone()
    return row is not None and row[0] == 0


@pytest.mark.parametrize(("toml", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_server_refuses_to_start(tmp_path: Path, empty_database: str, toml: str,
                                     expected: str) -> None:
    (tmp_path / "veracity.toml").write_text(toml)
    port = free_port()
    env = server_env(empty_database, port)
    proc = subprocess.run([VERACITY, "server"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert "Traceback" not in proc.stderr and "Veracity is serving" not in proc.stdout
    assert port_is_free(port)
    assert untouched(empty_database, tmp_path)


@pytest.mark.parametrize(("toml", "expected"), [c[1:] for c in CASES[:6]],
                         ids=[c[0] for c in CASES[:6]])
def test_the_crons_command_refuses_too(tmp_path: Path, toml: str, expected: str) -> None:
    (tmp_path / "veracity.toml").write_text(toml)
    env = server_env(f"sqlite:///{tmp_path}/v.db", free_port())
    proc = subprocess.run([VERACITY, "crons"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(expected), proc.stderr
    assert not (tmp_path / "v.db").exists()


def test_the_good_entry_starts(tmp_path: Path) -> None:
    """The baseline the cases above break: the same server starts with it."""
    (tmp_path / "veracity.toml").write_text(cron_toml(GOOD))
    port = free_port()
    with server_process(tmp_path, server_env(f"sqlite:///{tmp_path}/v.db", port),
                        port) as server:
        server.wait_healthy()
        listed = httpx.get(f"{server.url}/v1/crons", timeout=5).json()
        assert [i["name"] for i in listed["items"]] == ["worker_reconcile"]
