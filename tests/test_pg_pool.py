"""The reuse of test databases (tests/_pg.py, ``DatabasePool``): a database a test used comes
back in the state of a fresh clone of the migrated template (every object and row, no
statistics; a small table may keep invisible dead rows), or is not reused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests._pg import DatabasePool, database_exists, database_state, with_database

EXECUTION = (
    "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, scheduled_at,"
    " created_at, updated_at) VALUES (%s, 'test:a/b.c', '[]', 'pending', 'd', now(), now(),"
    " now())"
)


@pytest.fixture
def pool(pg_server_url: str, pg_template: str) -> Iterator[DatabasePool]:
    """A pool of one database (each acquire waits for the reset of the one given back)."""
    prefix = f"veracity_pooltest_{uuid.uuid4().hex[:8]}"
    p = DatabasePool(pg_server_url, pg_template, prefix=prefix, size=1)
    try:
        yield p
    finally:
        p.close()


def connect(pool: DatabasePool, name: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(with_database(pool.server_url, name), autocommit=True)


def state(pool: DatabasePool, name: str) -> object:
    with connect(pool, name) as conn:
        return database_state(conn)


def template_state(pool: DatabasePool) -> object:
    return state(pool, pool.template)


def test_a_used_database_comes_back_empty_under_a_new_name(pool: DatabasePool) -> None:
    first = pool.acquire()
    with connect(pool, first) as conn:
        ident = uuid.uuid4()
        conn.execute(EXECUTION, (ident,))
        conn.execute(
            "INSERT INTO veracity_history (execution_id, seq, kind, at) VALUES (%s, 1, 'x', now())",
            (ident,),
        )
        conn.execute(
            "INSERT INTO veracity_messages (execution_id, topic, payload, created_at)"
            " VALUES (%s, 't', '1', now()), (%s, 't', '2', now())",
            (ident, ident),
        )
        conn.execute(
            "INSERT INTO veracity_workers VALUES ('w', 'h', 1, 'd', '[]', 1, now(), now(), NULL)"
        )
    assert state(pool, first) != template_state(pool)
    pool.release(first)

    second = pool.acquire()
    assert (pool.cloned, pool.reused) == (1, 1)
    assert second != first
    assert not database_exists(pool.server_url, first)
    assert state(pool, second) == template_state(pool)
    with connect(pool, second) as conn:
        for table in ("veracity_executions", "veracity_history", "veracity_messages",
                      "veracity_workers"):
            query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
            assert conn.execute(query).fetchone() == (0,), table
        conn.execute(EXECUTION, (uuid.uuid4(),))
        # the sequence starts over, as in a fresh clone
        row = conn.execute(
            "INSERT INTO veracity_messages (execution_id, topic, payload, created_at)"
            " SELECT id, 't', '1', now() FROM veracity_executions RETURNING id"
        ).fetchone()
        assert row == (1,)
    pool.release(second)


def _table_facts(conn: psycopg.Connection[tuple[object, ...]],
                 table: str) -> tuple[int, int, float, float]:
    """(live rows, pages on disk, reltuples, the planner's row estimate for a full scan)."""
    name = sql.Identifier(table)
    facts = conn.execute(sql.SQL(
        "SELECT (SELECT count(*) FROM {}), pg_relation_size(%s::regclass) / 8192,"
        " (SELECT reltuples FROM pg_class WHERE oid = %s::regclass)").format(name),
        (table, table)).fetchone()
    assert facts is not None
    ((plan,),) = conn.execute(
        sql.SQL("EXPLAIN (FORMAT JSON) SELECT * FROM {}").format(name)).fetchall()
    assert isinstance(plan, list)
    return (int(str(facts[0])), int(str(facts[1])), float(str(facts[2])),
            float(plan[0]["Plan"]["Plan Rows"]))


def test_small_tables_are_emptied_by_delete_the_others_truncated(pool: DatabasePool) -> None:
    """A table left small (at most 8 pages) and never analysed is emptied with DELETE: its
    dead rows stay, but no query sees a row and the planner sizes it as a fresh clone's. A
    bigger table, or one analysed, is truncated: no page left, statistics as new."""
    tables = ("veracity_executions", "veracity_history", "veracity_workers")
    with connect(pool, pool.template) as conn:
        fresh = {t: _table_facts(conn, t) for t in tables}
    assert all(rows == 0 and pages == 0 for rows, pages, _, _ in fresh.values()), fresh

    first = pool.acquire()
    with connect(pool, first) as conn:
        ident = uuid.uuid4()
        conn.execute(EXECUTION, (ident,))  # small, never analysed: DELETE
        conn.execute(  # far more than 8 pages: TRUNCATE
            "INSERT INTO veracity_history (execution_id, seq, kind, at, data)"
            " SELECT %s, n, 'x', now(), json_build_object('pad', repeat('x', 200))"
            " FROM generate_series(1, 2000) n", (ident,))
        conn.execute(
            "INSERT INTO veracity_workers VALUES ('w', 'h', 1, 'd', '[]', 1, now(), now(), NULL)"
        )
        conn.execute("ANALYZE veracity_workers")  # one row, but analysed: TRUNCATE
    pool.release(first)

    second = pool.acquire()
    assert pool.reused == 1
    assert state(pool, second) == template_state(pool)
    with connect(pool, second) as conn:
        after = {t: _table_facts(conn, t) for t in tables}
    rows, pages, reltuples, estimate = after["veracity_executions"]
    assert rows == 0 and pages >= 1  # emptied by DELETE: its page is still there
    assert (reltuples, estimate) == fresh["veracity_executions"][2:]
    assert after["veracity_history"] == fresh["veracity_history"]
    assert after["veracity_workers"] == fresh["veracity_workers"]
    pool.release(second)


def test_a_connection_left_open_is_ended_and_cannot_come_back(pool: DatabasePool) -> None:
    first = pool.acquire()
    url = with_database(pool.server_url, first)
    leftover = psycopg.connect(url, autocommit=True)
    try:
        leftover.execute("LISTEN veracity_pending")
        leftover.execute("SELECT pg_advisory_lock(42)")
        pool.release(first)
        second = pool.acquire()
        assert pool.reused == 1
        with pytest.raises(psycopg.OperationalError):
            leftover.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError, match="does not exist"):
            psycopg.connect(url, connect_timeout=5).close()
        with connect(pool, second) as conn:
            # no backend of the old test is left, so neither its lock nor its LISTEN
            assert conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone() == (0,)
            assert conn.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)
        pool.release(second)
    finally:
        leftover.close()


@pytest.mark.parametrize(
    "change",
    [
        "CREATE TABLE veracity_extra (x int)",
        "ALTER TABLE veracity_workers ADD COLUMN extra text",
        "CREATE INDEX veracity_extra ON veracity_history (kind)",
        "CREATE OR REPLACE FUNCTION veracity_notify_pending() RETURNS trigger"
        " LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
        "ALTER TABLE veracity_executions DISABLE TRIGGER veracity_executions_pending",
        "DELETE FROM veracity_migrations WHERE version = 4",
        "ALTER DATABASE {db} SET statement_timeout = '300ms'",
        "ALTER DATABASE {db} CONNECTION LIMIT 5",
    ],
    ids=["table", "column", "index", "function", "trigger", "ledger", "setting", "limit"],
)
def test_a_database_whose_schema_or_settings_changed_is_replaced(
    pool: DatabasePool, change: str
) -> None:
    first = pool.acquire()
    with connect(pool, first) as conn:
        conn.execute(change.format(db=sql.Identifier(first).as_string(conn)).encode())
    pool.release(first)

    second = pool.acquire()
    assert (pool.cloned, pool.reused) == (2, 0)
    assert not database_exists(pool.server_url, first)
    assert state(pool, second) == template_state(pool)
    with psycopg.connect(pool.server_url, autocommit=True) as admin:
        assert admin.execute(
            "SELECT d.datconnlimit, (SELECT count(*) FROM pg_db_role_setting s"
            " WHERE s.setdatabase = d.oid) FROM pg_database d WHERE d.datname = %s",
            (second,),
        ).fetchone() == (-1, 0)
    pool.release(second)


def test_a_database_that_refuses_connections_is_replaced(pool: DatabasePool) -> None:
    first = pool.acquire()
    with psycopg.connect(pool.server_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(first))
        )
    pool.release(first)
    second = pool.acquire()
    assert (pool.cloned, pool.reused) == (2, 0)
    assert state(pool, second) == template_state(pool)
    pool.release(second)


def test_close_drops_every_database(pool: DatabasePool) -> None:
    def named() -> int:
        with psycopg.connect(pool.server_url, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_database WHERE starts_with(datname, %s)", (pool.prefix,)
            ).fetchone()
        assert row is not None
        return int(row[0])

    first = pool.acquire()
    pool.acquire()  # a second one, still in use
    pool.release(first)  # being reset (renamed) on the helper thread
    assert named() == 2
    pool.close()
    assert named() == 0
