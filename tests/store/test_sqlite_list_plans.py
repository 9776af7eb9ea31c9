"""Every filter of the execution list (``GET /v1/executions``, ``veracity list``) that
narrows the rows (one or more statuses, an FFQN prefix, a deployment, flagged) answers its
first page on SQLite from an index in the list's order, reading about a page of rows, not
the table (migrations 0017 and 0021; docs/operations.md, What a list page costs).

The table gets 20,000 executions with rare values for each filter, as in
test_list_plans.py (PostgreSQL's). SQLite plans without statistics unless ANALYZE was run,
and the store never runs it: every filter is checked without sqlite_stat1 and after
ANALYZE. Two checks each, on the statements SqliteStore.execution_list itself runs (its
connection is wrapped to record them):

- EXPLAIN QUERY PLAN of each names the filter's index and neither sorts (``USE TEMP
  B-TREE FOR ORDER BY``) nor reads the table whole (``SCAN veracity_executions`` without
  an index, or in the list's order through veracity_executions_created, which reads every
  row newer than the page for a rare value);
- the call runs at most a few times the virtual machine's instructions of an unfiltered
  page (counted by a progress handler); reading the 20,000 rows runs over thirty times as
  many, and more as the table grows.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import run_async
from veracity.core.states import Status
from veracity.models import ExecutionFilter, ListCursor
from veracity.store import open_store
from veracity.store.sqlite.store import SqliteStore, _prefix_end

LIMIT = 50
ROWS = 20_000

FILL = """
WITH RECURSIVE g (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :rows)
INSERT INTO veracity_executions (
    id, ffqn, params, status, result, deployment_id, scheduled_at, created_at, updated_at,
    history_seq, flagged_at, flag_kind, engine)
SELECT printf('%08x-0000-4000-8000-%012x', i, i * 7919),
       CASE WHEN i % 5000 = 7 THEN 'rare:x/y.run'
            ELSE CASE i % 4 WHEN 0 THEN 'shop:orders/process.run'
                            WHEN 1 THEN 'shop:mail/send.run'
                            WHEN 2 THEN 'billing:invoices/make.run'
                            ELSE 'ops:cleanup/run.run' END END,
       '[]',
       CASE WHEN i % 100 = 0 THEN 'failed' WHEN i % 1000 = 1 THEN 'cancelled'
            WHEN i % 997 = 3 THEN 'blocked' ELSE 'completed' END,
       CASE WHEN i % 100 = 0 OR i % 1000 = 1 OR i % 997 = 3 THEN NULL ELSE '1' END,
       CASE WHEN i % 4000 = 5 THEN 'dep-rare' ELSE 'dep-' || (i % 3) END,
       t, t, t, 3,
       CASE WHEN i % 3000 = 11 THEN t END, CASE WHEN i % 3000 = 11 THEN 'unknown_id' END,
       CASE WHEN i % 3000 = 11 THEN 'n8n' END
FROM (SELECT i, 1893456000000000 + i * 1000000 AS t FROM g)
"""

STATUS = "veracity_executions_status_created"
FFQN = "veracity_executions_ffqn_status_created"
DEPLOYMENT = "veracity_executions_deployment_status_created"
FLAGGED = "veracity_executions_flagged_created"

# (name, the filter, the index its page is read from, rows on the page)
FILTERS: list[tuple[str, ExecutionFilter, str, int]] = [
    ("status=failed (1 %)", ExecutionFilter(statuses=(Status.FAILED,)), STATUS, LIMIT),
    ("status=cancelled (0.1 %)", ExecutionFilter(statuses=(Status.CANCELLED,)), STATUS, 20),
    ("status=blocked,cancelled", ExecutionFilter(statuses=(Status.BLOCKED, Status.CANCELLED)),
     STATUS, 40),
    ("status=completed", ExecutionFilter(statuses=(Status.COMPLETED,)), STATUS, LIMIT),
    ("status=pending (none)", ExecutionFilter(statuses=(Status.PENDING,)), STATUS, 0),
    ("ffqn_prefix common", ExecutionFilter(ffqn_prefix="shop:mail"), FFQN, LIMIT),
    ("ffqn_prefix of several", ExecutionFilter(ffqn_prefix="shop:"), FFQN, LIMIT),
    ("ffqn_prefix rare", ExecutionFilter(ffqn_prefix="rare:"), FFQN, 4),
    ("ffqn_prefix none", ExecutionFilter(ffqn_prefix="nope:"), FFQN, 0),
    ("deployment_id common", ExecutionFilter(deployment_id="dep-1"), DEPLOYMENT, LIMIT),
    ("deployment_id rare", ExecutionFilter(deployment_id="dep-rare"), DEPLOYMENT, 5),
    ("flagged", ExecutionFilter(flagged=True), FLAGGED, 7),
    # a status with a prefix or a deployment: the pair's index (migration 0021)
    ("status=failed, deployment_id common",
     ExecutionFilter(statuses=(Status.FAILED,), deployment_id="dep-1"), DEPLOYMENT, LIMIT),
    ("status=failed, ffqn_prefix common (none of both)",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="shop:mail"), FFQN, 0),
    ("status=failed, ffqn_prefix of several",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="shop:"), STATUS, LIMIT),
    ("status=blocked, deployment_id rare (none of both)",
     ExecutionFilter(statuses=(Status.BLOCKED,), deployment_id="dep-rare"), DEPLOYMENT, 0),
    # combined: read by the filter with the fewest rows (SqliteStore._lead), not the first
    ("status=completed, ffqn_prefix rare",
     ExecutionFilter(statuses=(Status.COMPLETED,), ffqn_prefix="rare:"), FFQN, 4),
    ("status=completed, deployment_id rare",
     ExecutionFilter(statuses=(Status.COMPLETED,), deployment_id="dep-rare"), DEPLOYMENT, 5),
    ("status=completed, flagged",
     ExecutionFilter(statuses=(Status.COMPLETED,), flagged=True), FLAGGED, 7),
    ("deployment_id common, flagged",
     ExecutionFilter(deployment_id="dep-2", flagged=True), FLAGGED, 7),
    ("deployment_id common, flagged (none of both)",
     ExecutionFilter(deployment_id="dep-1", flagged=True), FLAGGED, 0),
    ("ffqn_prefix common, flagged (none of both)",
     ExecutionFilter(ffqn_prefix="shop:mail", flagged=True), FLAGGED, 0),
]


class Recording:
    """The store's connection, recording each statement it runs with its parameters (on
    the connection or on a cursor of it)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.seen: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.seen.append((sql, params))
        return self.conn.execute(sql, params)

    def cursor(self) -> RecordingCursor:
        return RecordingCursor(self.conn.cursor(), self.seen)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class RecordingCursor:
    """A cursor of the store's connection, recording each statement it runs."""

    def __init__(self, cursor: sqlite3.Cursor, seen: list[tuple[str, Any]]) -> None:
        object.__setattr__(self, "_cursor", cursor)
        object.__setattr__(self, "_seen", seen)

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self._seen.append((sql, params))
        return cast(sqlite3.Cursor, self._cursor.execute(sql, params))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cursor, name, value)


def migrate_sqlite(path: Path) -> None:
    """A new SQLite database at ``path`` with Veracity's tables."""

    async def migrate() -> None:
        store = await open_store(f"sqlite:///{path}")
        try:
            await store.migrate()
        finally:
            await store.close()

    run_async(migrate())


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated database with the rows, without statistics (as the store leaves it)."""
    path = tmp_path_factory.mktemp("sqlite_plans") / "filled.db"
    migrate_sqlite(path)
    with sqlite3.connect(path) as conn:
        conn.execute(FILL, {"rows": ROWS})
    return path


@pytest.fixture(scope="module", params=["no statistics", "analyzed"])
def database(request: pytest.FixtureRequest, filled: Path) -> Iterator[Path]:
    """The filled database as the store leaves it, or after ANALYZE (sqlite_stat1)."""
    if request.param == "no statistics":
        yield filled
        return
    path = filled.with_name("analyzed.db")
    shutil.copy(filled, path)
    with sqlite3.connect(path) as conn:
        conn.execute("ANALYZE")
        assert conn.execute("SELECT count(*) FROM sqlite_stat1").fetchone()[0] > 0
    yield path
    path.unlink()


def run_list(path: Path, filter: ExecutionFilter, after: ListCursor | None = None
             ) -> tuple[int, list[tuple[str, Any]], int]:
    """The store's page for ``filter`` (the first, or the one after ``after``): its length,
    the statements it ran and the virtual machine's instructions they took (in tens)."""
    ticks = [0]

    def tick() -> int:
        ticks[0] += 1
        return 0

    async def page() -> tuple[int, list[tuple[str, Any]], int]:
        store = await open_store(f"sqlite:///{path}")
        assert isinstance(store, SqliteStore)
        try:
            await store.execution_list(ExecutionFilter(), limit=1)  # the schema is read
            recording = Recording(store._c())
            store._conn = cast(sqlite3.Connection, recording)
            await store._run(recording.conn.set_progress_handler, tick, 10)
            rows = await store.execution_list(filter, limit=LIMIT, after=after)
            await store._run(recording.conn.set_progress_handler, None, 0)
            store._conn = recording.conn
        finally:
            await store.close()
        return len(rows), recording.seen, ticks[0]

    return run_async(page())


def plan(path: Path, sql: str, params: Any) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


@pytest.mark.parametrize(("name", "filter", "index", "rows"), FILTERS,
                         ids=[f[0] for f in FILTERS])
def test_each_filter_reads_its_first_page_from_its_index(
    database: Path, name: str, filter: ExecutionFilter, index: str, rows: int
) -> None:
    found, statements, ticks = run_list(database, filter)
    assert found == rows, (name, found)
    reads = [(sql, params) for sql, params in statements
             if "veracity_executions" in sql and not sql.startswith(("BEGIN", "COMMIT"))]
    assert reads, (name, statements)
    lines = [line for sql, params in reads for line in plan(database, sql, params)]
    # the page itself (not the counts of SqliteStore._lead) is read from the index; a
    # prefix no workflow has reads no page, only its probe of the names' index
    pages = [line for sql, params in reads if "count(*)" not in sql and "LIMIT :limit" in sql
             for line in plan(database, sql, params)] or lines
    assert all(f"INDEX {index} " in line or line.endswith(f"INDEX {index}")
               for line in pages if "veracity_executions" in line), (name, pages)
    assert not any("TEMP B-TREE FOR ORDER BY" in line for line in lines), (name, lines)
    assert not any(re.fullmatch(r"SCAN (veracity_executions|x)( AS \w+)?", line)
                   or re.search(r"INDEX veracity_executions_created\b", line)
                   for line in lines), (name, lines)
    _, _, unfiltered = run_list(database, ExecutionFilter())
    # a page of each of the two statuses or names, and the names' probes: a few pages;
    # filters combined also count their index entries first (SqliteStore._lead: a number
    # capped whatever the table holds, here up to 32 pages' worth of entries for the
    # common one), still well under reading the table (over 30 times: below)
    given = [filter.statuses, filter.ffqn_prefix, filter.deployment_id, filter.flagged]
    combined = sum(1 for g in given if g) > 1
    assert ticks <= (16 if combined else 4) * unfiltered, (name, ticks, unfiltered)


DEEP = 15_000
"""How far down the list (newest first) the deep pages below start."""


def _row(i: int) -> tuple[datetime, uuid.UUID]:
    """Row ``i`` of FILL: its created_at and id."""
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=1893456000000000 + i * 10**6)
    return at, uuid.UUID(f"{i:08x}-0000-4000-8000-{i * 7919:012x}")


DEEP_PAGES: list[tuple[str, ExecutionFilter, bool]] = [
    ("unfiltered, after a cursor", ExecutionFilter(), True),
    ("status=completed, after a cursor", ExecutionFilter(statuses=(Status.COMPLETED,)), True),
    ("deployment_id common, after a cursor", ExecutionFilter(deployment_id="dep-1"), True),
    ("flagged=false, after a cursor", ExecutionFilter(flagged=False), True),
    ("created_before", ExecutionFilter(created_before=_row(ROWS - DEEP)[0]), False),
    ("status=completed, created_before",
     ExecutionFilter(statuses=(Status.COMPLETED,), created_before=_row(ROWS - DEEP)[0]), False),
]


@pytest.mark.parametrize(("name", "filter", "cursor"), DEEP_PAGES, ids=[d[0] for d in DEEP_PAGES])
def test_a_page_far_down_the_list_reads_about_a_page(
    database: Path, name: str, filter: ExecutionFilter, cursor: bool
) -> None:
    """The cursor and the dates bound the index's range (queries.sql, execution_list): the
    page after the 15,000th newest execution, or before a created_before that far down,
    reads about a page, not the 15,000 rows newer than it."""
    at, id_ = _row(ROWS - DEEP)
    found, statements, ticks = run_list(database, filter, ListCursor(at, id_) if cursor else None)
    assert found == LIMIT, (name, found)
    reads = [(sql, params) for sql, params in statements if "veracity_executions" in sql]
    lines = [line for sql, params in reads for line in plan(database, sql, params)]
    assert any("(created_at,id)<(?,?)" in line for line in lines), (name, lines)
    _, _, unfiltered = run_list(database, ExecutionFilter())
    assert ticks <= 4 * unfiltered, (name, ticks, unfiltered)


def test_reading_the_table_would_cost_many_pages(database: Path) -> None:
    """What the instruction count above tells apart: the rare deployment's page read in
    the list's order through veracity_executions_created (the list before 0017: all 20,000
    rows read for 5) runs over ten times an unfiltered page's instructions (34 times,
    measured; its own index takes a tenth of one)."""
    _, _, unfiltered = run_list(database, ExecutionFilter())
    ticks = [0]

    def tick() -> int:
        ticks[0] += 1
        return 0

    with sqlite3.connect(database) as conn:
        conn.set_progress_handler(tick, 10)
        conn.execute(
            "SELECT * FROM veracity_executions INDEXED BY veracity_executions_created "
            "WHERE deployment_id = 'dep-rare' ORDER BY created_at DESC, id DESC LIMIT 50"
        ).fetchall()
    assert ticks[0] > 10 * unfiltered, (ticks[0], unfiltered)


@pytest.mark.parametrize("prefix", ["shop:", "a\ud7ff", "b\U0010ffff", "\U0010ffff", ""])
def test_a_prefix_is_the_range_up_to_its_end(prefix: str) -> None:
    """Every string that starts with the prefix, and no other, is in [prefix, end)."""
    end = _prefix_end(prefix)
    for s in [prefix, prefix + "x", prefix + "\U0010ffff" * 3, "a\ue000", "b", "shop;",
              "shoq", "\U0010ffff\U0010ffff", "z" * 512]:
        assert (prefix <= s < end) == s.startswith(prefix), (prefix, s, end)


def test_every_combination_answers_what_reading_every_row_would(filled: Path) -> None:
    """Whichever filter leads, the page is the rows that pass them all, newest first: each
    combination of a status, a prefix, a deployment and flagged, against the same filter
    checked row by row in Python over the whole table."""
    import itertools

    with sqlite3.connect(filled) as conn:
        conn.row_factory = sqlite3.Row
        table = conn.execute("SELECT id, status, ffqn, deployment_id, flagged_at, created_at "
                             "FROM veracity_executions").fetchall()
    newest = sorted(table, key=lambda r: (r["created_at"], r["id"]), reverse=True)
    statuses = [None, (Status.COMPLETED,), (Status.FAILED,), (Status.CANCELLED, Status.BLOCKED)]
    prefixes = [None, "rare:", "shop:mail", "shop:", ""]
    deployments = [None, "dep-1", "dep-rare"]
    flags = [None, True, False]

    async def pages() -> None:
        store = await open_store(f"sqlite:///{filled}")
        try:
            for st, pre, dep, fl in itertools.product(statuses, prefixes, deployments, flags):
                f = ExecutionFilter(statuses=st or (), ffqn_prefix=pre, deployment_id=dep,
                                    flagged=fl)
                got = [str(e.id) for e in await store.execution_list(f, limit=LIMIT)]
                want = [r["id"] for r in newest
                        if (st is None or r["status"] in {str(s) for s in st})
                        and (pre is None or r["ffqn"].startswith(pre))
                        and (dep is None or r["deployment_id"] == dep)
                        and (fl is None or (r["flagged_at"] is not None) == fl)][:LIMIT]
                assert got == want, (st, pre, dep, fl)
        finally:
            await store.close()

    run_async(pages())
