"""The PostgreSQL test plumbing itself: throwaway clusters and per-test databases."""

from __future__ import annotations

import os
import pwd
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests._needs import missing
from tests._pg import (
    TempCluster,
    create_database,
    create_database_from_template,
    database_exists,
    drop_database,
    find_pg_bin_dir,
    server_answers,
    with_database,
)


def _cluster_runnable() -> str | None:
    """Why a throwaway cluster cannot be started here, or ``None`` if it can."""
    if find_pg_bin_dir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' system user"
    return None


def test_with_database_swaps_only_the_name() -> None:
    assert (
        with_database("postgresql://u:p@h:5433/postgres?sslmode=disable&dbname=x", "t_1")
        == "postgresql://u:p@h:5433/t_1?sslmode=disable"
    )
    assert with_database("postgresql://postgres@127.0.0.1", "a b") == (
        "postgresql://postgres@127.0.0.1/a%20b"
    )


def test_nothing_answers_on_a_closed_port() -> None:
    from tests._pg import free_port

    assert not server_answers(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")


def test_temp_cluster_starts_answers_and_is_removed() -> None:
    reason = _cluster_runnable()
    if reason is not None:
        missing(f"cannot start a throwaway cluster: {reason}")
    cluster = TempCluster()
    try:
        cluster.start()
        folder, port, url = cluster.folder, cluster.port, cluster.url
        assert folder is not None and folder.is_dir()
        assert port is not None and port != 5432
        assert url == f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
            assert conn.execute("SHOW unix_socket_directories").fetchone() == (str(folder),)
    finally:
        cluster.stop()
    assert cluster.folder is None and cluster.port is None
    assert not folder.exists()
    assert not server_answers(url)
    cluster.stop()  # idempotent


@pytest.fixture
def small_template(pg_server_url: str) -> Iterator[str]:
    """A template database built with plain SQL (stands in for the store's migrations)."""
    name = f"veracity_tmpl_test_{uuid.uuid4().hex[:8]}"
    create_database(pg_server_url, name)
    try:
        with psycopg.connect(with_database(pg_server_url, name), autocommit=True) as conn:
            conn.execute("CREATE TABLE from_template (id int PRIMARY KEY, note text)")
            conn.execute("INSERT INTO from_template VALUES (1, 'seed')")
        yield name
    finally:
        drop_database(pg_server_url, name)


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {row[0] for row in rows}


def test_databases_from_a_template_are_isolated(pg_server_url: str, small_template: str) -> None:
    first, second = (f"veracity_t_{uuid.uuid4().hex}" for _ in range(2))
    try:
        create_database_from_template(pg_server_url, first, small_template)
        create_database_from_template(pg_server_url, second, small_template)
        first_url = with_database(pg_server_url, first)
        second_url = with_database(pg_server_url, second)

        with psycopg.connect(first_url) as conn:
            conn.execute("CREATE TABLE only_in_first (x int)")
            conn.execute("INSERT INTO from_template VALUES (2, 'first')")

        assert _tables(first_url) == {"from_template", "only_in_first"}
        assert _tables(second_url) == {"from_template"}
        with psycopg.connect(second_url) as conn:
            assert conn.execute("SELECT id FROM from_template").fetchall() == [(1,)]
        assert _tables(with_database(pg_server_url, small_template)) == {"from_template"}

        # A connection left open does not block the drop (WITH (FORCE)).
        leftover = psycopg.connect(first_url)
        try:
            drop_database(pg_server_url, first)
        finally:
            leftover.close()
        assert not database_exists(pg_server_url, first)
        drop_database(pg_server_url, first)  # IF EXISTS: a second drop is harmless
    finally:
        drop_database(pg_server_url, first)
        drop_database(pg_server_url, second)
    assert not database_exists(pg_server_url, second)
