"""An FFQN prefix shared by many workflows, on PostgreSQL (docs/operations.md, What a list
page costs): its pages, alone and with every other filter, against the filters checked
row by row; the window its page is first looked for in (queries.sql,
execution_list_by_ffqn_window) and when the store reads it (the plans of a prefix's page
otherwise: test_list_plans.py). The table: tests/store/_many_workflows.py, ANALYZEd."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest

from tests.store._many_workflows import FILTERS, LIMIT, ROWS, WORKFLOWS, Row, check_pages
from tests.store.test_list_plans import _rows_read, migrated_database, scans
from veracity.models import ExecutionFilter, ListCursor
from veracity.store.postgres.store import WINDOW_ROWS, PostgresStore, _q, list_statement

FILL = """
INSERT INTO veracity_executions (
    id, ffqn, params, status, result, deployment_id, scheduled_at, created_at, updated_at,
    history_seq, flagged_at, flag_kind, engine)
SELECT (lpad(to_hex(i), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(i * 7919), 12, '0'))::uuid,
       CASE WHEN i %% 50 = 0 THEN 'lib:w' || lpad(((i / 50) %% %(workflows)s)::text, 2, '0')
            ELSE 'app:w' || lpad((i %% %(workflows)s)::text, 2, '0') END || '/run.run',
       '[]',
       CASE WHEN i %% 37 = 0 THEN 'failed' WHEN i %% 101 = 3 THEN 'blocked'
            ELSE 'completed' END,
       CASE WHEN i %% 37 = 0 OR i %% 101 = 3 THEN NULL ELSE '1'::json END,
       'dep-' || (i %% 3), t, t, t, 3,
       CASE WHEN i %% 250 = 11 OR i %% 50 = 0 THEN t END,
       CASE WHEN i %% 250 = 11 OR i %% 50 = 0 THEN 'unknown_id' END,
       CASE WHEN i %% 250 = 11 OR i %% 50 = 0 THEN 'n8n' END
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT timestamptz '2030-01-01' + i * interval '1 second' AS t) AS at
"""


@pytest.fixture(scope="module")
def many(pg_server_url: str) -> Iterator[str]:
    with migrated_database(pg_server_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FILL, {"rows": ROWS, "workflows": WORKFLOWS})
            conn.execute("ANALYZE veracity_executions")
        yield url


@pytest.fixture(scope="module")
def table(many: str) -> list[Row]:
    with psycopg.connect(many) as conn:
        return [Row(str(r[0]), r[1], r[2], r[3], r[4] is not None, r[5])
                for r in conn.execute("SELECT id, status, ffqn, deployment_id, flagged_at, "
                                      "created_at FROM veracity_executions")]


@pytest.mark.parametrize("filter", FILTERS, ids=[repr(f) for f in FILTERS])
def test_pages_answer_what_reading_every_row_would(many: str, table: list[Row],
                                                   filter: ExecutionFilter) -> None:
    """The first page, the next, a page after a cursor deep in the list (fewer than a page
    of rows after it) and after the last row."""
    check_pages(many, table, filter, LIMIT // 2)


def _window_plan(url: str, filter: ExecutionFilter) -> tuple[dict[str, Any], int]:
    """The plan (run) of the window's statement for ``filter``'s first page, as
    PostgresStore.execution_list sends it, and how many rows it answered."""
    _, args = list_statement(filter, limit=LIMIT)
    args = {**args, "window": WINDOW_ROWS}
    with psycopg.connect(url, prepare_threshold=None) as conn:
        conn.execute(_q("list_planning"))
        (plan,), = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) "
                                + _q("execution_list_by_ffqn_window"), args).fetchall()
        rows = len(conn.execute(_q("execution_list_by_ffqn_window"), args).fetchall())
        conn.rollback()
    return cast(dict[str, Any], plan[0]["Plan"]), rows


@pytest.mark.parametrize(("prefix", "rows"), [("app:", LIMIT), ("lib:", 0)])
def test_the_window_reads_about_its_rows_and_answers_only_a_whole_page(
        many: str, prefix: str, rows: int) -> None:
    """``app:`` (49 rows in 50) has a page among the newest 200 rows of the statuses: the
    window's statement answers it, reading those 200 keys and rows and no (workflow,
    status) pair (a page of each of its 120 pairs would read most of the 6,000 rows).
    ``lib:`` (1 row in 50) has 4 rows there: the statement answers nothing, and the store
    reads the page by the prefix's pairs."""
    top, answered = _window_plan(many, ExecutionFilter(ffqn_prefix=prefix))
    assert answered == rows
    assert "Seq Scan" not in {n["Node Type"] for n in scans(top)}
    assert not any(n.get("Index Name") == "veracity_executions_ffqn_status_created"
                   for n in scans(top))
    assert _rows_read(top) <= 3 * WINDOW_ROWS + LIMIT, _rows_read(top)


@pytest.mark.parametrize(("prefix", "first", "again"), [
    ("app:", ["execution_list_prefix_names", "execution_list_by_ffqn_window"],
     ["execution_list_by_ffqn_window"]),
    ("lib:", ["execution_list_prefix_names", "execution_list_by_ffqn_window",
              "execution_list_by_ffqn"], ["execution_list_by_ffqn"]),
    ("app:w1", ["execution_list_prefix_names", "execution_list_by_ffqn"],
     ["execution_list_by_ffqn"]),
])
def test_the_store_counts_a_prefixs_workflows_and_its_windows_misses_once_a_minute(
        many: str, prefix: str, first: list[str], again: list[str]) -> None:
    """PostgresStore.execution_list: a prefix's first page counts its workflows (up to
    32); with as many, it reads the window, and when that held less than a page, the
    page by the prefix's pairs. The count and a miss are remembered (PREFIX_NAMES_TTL):
    the next page of the same filter runs only the statement that answers it. ``app:w1``
    has 11 workflows: no window."""
    from tests.conftest import run_async
    from veracity.store import open_store

    async def statements() -> tuple[list[str], list[str]]:
        store = await open_store(many)
        assert isinstance(store, PostgresStore)
        ran: list[str] = []
        real = store._fetchall

        async def recording(name: str, *args: Any, **kwargs: Any) -> list[Any]:
            ran.append(name)
            return await real(name, *args, **kwargs)

        store._fetchall = recording  # type: ignore[method-assign]
        try:
            filter = ExecutionFilter(ffqn_prefix=prefix)
            page = await store.execution_list(filter, limit=LIMIT)
            assert len(page) == LIMIT
            once = list(ran)
            ran.clear()
            after = ListCursor(page[-1].created_at, page[-1].id)
            assert len(await store.execution_list(filter, limit=LIMIT, after=after)) == LIMIT
            return once, list(ran)
        finally:
            await store.close()

    assert run_async(statements()) == (first, again)
