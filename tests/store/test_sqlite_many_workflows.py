"""An FFQN prefix shared by many workflows, on SQLite (docs/operations.md, What a list page
costs): without a status filter its pages read only the (workflow, status) pairs that have
rows (queries.sql, execution_list_pairs), and a page of 32 such values or more is first
looked for among the newest WINDOW_PAGES (4) pages of rows (SqliteStore._window_page),
where a prefix most rows have is found after about a page; a rarer prefix's keys are
merged in two rounds (SqliteStore._merged_keys).

The table: tests/store/_many_workflows.py.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.store._many_workflows import FILTERS, LIMIT, ROWS, WORKFLOWS, Row, check_pages
from tests.store.test_sqlite_list_plans import migrate_sqlite, plan, run_list
from veracity.models import ExecutionFilter
from veracity.store.sqlite.store import _KEYS, WINDOW_PAGES, WINDOW_VALUES, _prefix_end
from veracity.store.sqlite.store import Q as QUERIES

FILL = """
WITH RECURSIVE g (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :rows)
INSERT INTO veracity_executions (
    id, ffqn, params, status, result, deployment_id, scheduled_at, created_at, updated_at,
    history_seq, flagged_at, flag_kind, engine)
SELECT printf('%08x-0000-4000-8000-%012x', i, i * 7919),
       CASE WHEN i % 50 = 0 THEN 'lib:w' || printf('%02d', (i / 50) % :workflows)
            ELSE 'app:w' || printf('%02d', i % :workflows) END || '/run.run',
       '[]',
       CASE WHEN i % 37 = 0 THEN 'failed' WHEN i % 101 = 3 THEN 'blocked'
            ELSE 'completed' END,
       CASE WHEN i % 37 = 0 OR i % 101 = 3 THEN NULL ELSE '1' END,
       'dep-' || (i % 3), t, t, t, 3,
       CASE WHEN i % 250 = 11 OR i % 50 = 0 THEN t END,
       CASE WHEN i % 250 = 11 OR i % 50 = 0 THEN 'unknown_id' END,
       CASE WHEN i % 250 = 11 OR i % 50 = 0 THEN 'n8n' END
FROM (SELECT i, 1893456000000000 + i * 1000000 AS t FROM g)
"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite_many") / "many.db"
    migrate_sqlite(path)
    with sqlite3.connect(path) as conn:
        conn.execute(FILL, {"rows": ROWS, "workflows": WORKFLOWS})
    return path


@pytest.mark.parametrize("prefix", ["app:", "lib:", "app:w1", "lib:w07/run.run", "a",
                                    "nope:", "lib:w07/run.run/"])
def test_the_pairs_are_the_prefix_s_workflows_and_their_statuses(many: Path,
                                                                  prefix: str) -> None:
    """execution_list_pairs: each (workflow, status) with the prefix that has a row, once,
    in the index's order; none for a prefix no workflow has."""
    with sqlite3.connect(many) as conn:
        got = conn.execute(QUERIES["execution_list_pairs"], {
            "ffqn_prefix": prefix, "ffqn_end": _prefix_end(prefix), "cap": -1}).fetchall()
        want = conn.execute(
            "SELECT DISTINCT ffqn, status FROM veracity_executions "
            "WHERE substr(ffqn, 1, length(:p)) = :p ORDER BY ffqn, status", {"p": prefix}
        ).fetchall()
    assert got == want
    if prefix == "app:":  # every workflow has completed, failed and blocked rows
        assert len(got) == 3 * WORKFLOWS
    lines = [line for line in plan(many, QUERIES["execution_list_pairs"], {
        "ffqn_prefix": prefix, "ffqn_end": _prefix_end(prefix), "cap": -1})
             if "veracity" in line]
    assert lines and all("INDEX veracity_executions_ffqn_status_created" in line
                         for line in lines), lines


def _statements(seen: list[tuple[str, Any]], name: str) -> int:
    return sum(1 for sql, _ in seen if sql == QUERIES[name])


def test_a_prefix_most_rows_have_is_found_in_the_window(many: Path) -> None:
    """``app:`` (49 rows in 50, 120 pairs): its window's floor, then one page read newest
    first from veracity_executions_created, no statement per pair; about a page's cost."""
    found, seen, ticks = run_list(many, ExecutionFilter(ffqn_prefix="app:"))
    assert found == LIMIT
    assert _statements(seen, "execution_list_floor") == 1
    assert _statements(seen, "execution_list") == 1
    page = next(params for sql, params in seen if sql == QUERIES["execution_list"])
    assert page["lower_at"] > 0  # no further back than the window's floor
    assert "INDEX veracity_executions_created" in " ".join(
        plan(many, QUERIES["execution_list"], page))
    assert len(seen) < 10, [sql[:60] for sql, _ in seen]
    _, _, unfiltered = run_list(many, ExecutionFilter())
    assert ticks <= 4 * unfiltered, (ticks, unfiltered)


def test_a_prefix_few_rows_have_reads_each_pair_after_the_window(many: Path) -> None:
    """``lib:`` (1 row in 50: 4 in the window): the window holds less than a page, so each
    (workflow, status) pair of the prefix is read, its keys merged: a statement per pair
    that has rows, not per workflow and every status, then one for each pair that may
    have more keys on the page (at most a page of them)."""
    found, seen, _ = run_list(many, ExecutionFilter(ffqn_prefix="lib:"))
    assert found == LIMIT
    with sqlite3.connect(many) as conn:
        pairs = conn.execute("SELECT count(*) FROM (SELECT DISTINCT ffqn, status FROM "
                             "veracity_executions WHERE ffqn LIKE 'lib:%')").fetchone()[0]
    assert WINDOW_VALUES <= pairs < 3 * WORKFLOWS
    assert _statements(seen, "execution_list_floor") == 1
    reads = [params for sql, params in seen if sql == _KEYS["ffqn"]]
    assert pairs <= len(reads) <= pairs + LIMIT
    share = -(-2 * LIMIT // pairs)  # two pages spread over the pairs
    assert share < LIMIT and all(p["limit"] == share for p in reads[:pairs])


def test_a_prefix_of_few_workflows_is_not_looked_for_in_the_window(many: Path) -> None:
    """Under 32 values (``app:w1``: 11 workflows, 33 pairs; ``app:w01``: 3 pairs): the
    window is not read when the pairs are fewer than WINDOW_VALUES."""
    _, seen, _ = run_list(many, ExecutionFilter(ffqn_prefix="app:w01"))
    assert _statements(seen, "execution_list_floor") == 0


@pytest.mark.parametrize("filter", FILTERS, ids=[repr(f) for f in FILTERS])
def test_pages_answer_what_reading_every_row_would(many: Path, filter: ExecutionFilter
                                                   ) -> None:
    """The first page, the next, a page after a cursor deep in the list (where the range
    holds fewer rows than the window) and after the last row."""
    with sqlite3.connect(many) as conn:
        table = [Row(r[0], r[1], r[2], r[3], r[4] is not None,
                     datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=r[5]))
                 for r in conn.execute("SELECT id, status, ffqn, deployment_id, flagged_at, "
                                       "created_at FROM veracity_executions")]
    check_pages(f"sqlite:///{many}", table, filter, WINDOW_PAGES * LIMIT // 2)
