"""Every filter of the execution list (``GET /v1/executions``, ``veracity list``), alone
and in the combinations a status with a workflow prefix or a deployment make, answers its
first page (and the page after a cursor) on PostgreSQL from an index, reading about a page
of rows, not the table (docs/operations.md, What a list page costs).

The table gets 20,000 executions and is ANALYZEd, with rare values for each filter (a
status, an FFQN prefix, a deployment, flagged rows) and no pending one: with real
statistics the planner's choice is the one production gets. A list page is planned with
the store's own settings (queries.sql, ``list_planning``: no bitmap or sequential scans
unless nothing else can run), so each plan is checked twice: no Seq Scan on
veracity_executions, and the rows its scans of veracity_executions read (returned plus
removed by a filter) stay under 10 pages' worth, where reading the table would be 20,000:
reading the whole table through the wrong index fails the second. Each plan is run
(EXPLAIN ANALYZE). The same holds with 2,000 rows the statistics do not know of, and on a
table never analyzed.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
import pytest

from veracity.core.states import Status
from veracity.models import ExecutionFilter, ListCursor
from veracity.store.postgres.store import _q, list_statement

LIMIT = 50
ROWS = 20_000

# (name, the filter): each filter the API offers, alone, then combined
FILTERS: list[tuple[str, ExecutionFilter]] = [
    ("unfiltered", ExecutionFilter()),
    ("status=failed (1 %)", ExecutionFilter(statuses=(Status.FAILED,))),
    ("status=cancelled (0.1 %)", ExecutionFilter(statuses=(Status.CANCELLED,))),
    ("status=blocked,cancelled", ExecutionFilter(statuses=(Status.BLOCKED, Status.CANCELLED))),
    ("status=completed", ExecutionFilter(statuses=(Status.COMPLETED,))),
    ("ffqn_prefix common", ExecutionFilter(ffqn_prefix="shop:mail")),
    ("ffqn_prefix of several", ExecutionFilter(ffqn_prefix="shop:")),
    ("ffqn_prefix rare", ExecutionFilter(ffqn_prefix="rare:")),
    ("deployment_id common", ExecutionFilter(deployment_id="dep-1")),
    ("deployment_id rare", ExecutionFilter(deployment_id="dep-rare")),
    ("flagged", ExecutionFilter(flagged=True)),
    ("flagged=false", ExecutionFilter(flagged=False)),
    ("created_after", ExecutionFilter(created_after=datetime(2030, 1, 1, 5, tzinfo=UTC))),
    ("created_before", ExecutionFilter(created_before=datetime(2030, 1, 1, 1, tzinfo=UTC))),
    # combined (migration 0020): a status with a prefix none of its rows has (no failed row
    # is a mail's; the status's index would read every failed row, the name's every mail),
    # with a deployment it has few rows in, a rare prefix of a common deployment, flagged
    # with a common status or prefix
    ("status=failed&ffqn_prefix=shop:mail (none)",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="shop:mail")),
    ("status=failed&ffqn_prefix=shop:orders",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="shop:orders")),
    ("status=cancelled&ffqn_prefix=shop:",
     ExecutionFilter(statuses=(Status.CANCELLED,), ffqn_prefix="shop:")),
    ("status=failed&deployment_id=dep-rare",
     ExecutionFilter(statuses=(Status.FAILED,), deployment_id="dep-rare")),
    ("status=completed&deployment_id=dep-1",
     ExecutionFilter(statuses=(Status.COMPLETED,), deployment_id="dep-1")),
    ("ffqn_prefix=rare:&deployment_id=dep-1",
     ExecutionFilter(ffqn_prefix="rare:", deployment_id="dep-1")),
    ("status=completed&flagged", ExecutionFilter(statuses=(Status.COMPLETED,), flagged=True)),
    ("ffqn_prefix=shop:mail&flagged", ExecutionFilter(ffqn_prefix="shop:mail", flagged=True)),
]
CURSOR = ListCursor(datetime(2030, 1, 1, 2, tzinfo=UTC),
                    uuid.UUID("00000000-0000-0000-0000-000000000000"))

FILL = """
INSERT INTO veracity_executions (
    id, ffqn, params, status, result, error, deployment_id, scheduled_at, created_at,
    updated_at, history_seq, lease_owner, lease_expires_at, flagged_at, flag_kind, engine)
SELECT gen_random_uuid(),
       CASE WHEN i %% 5000 = 7 THEN 'rare:x/y.run'
            ELSE (ARRAY['shop:orders/process.run', 'shop:mail/send.run',
                        'billing:invoices/make.run', 'ops:cleanup/run.run'])[1 + i %% 4] END,
       '[]',
       CASE WHEN i %% 100 = 0 THEN 'failed' WHEN i %% 1000 = 1 THEN 'cancelled'
            WHEN i %% 997 = 3 THEN 'blocked' ELSE 'completed' END,
       CASE WHEN i %% 100 = 0 OR i %% 1000 = 1 OR i %% 997 = 3 THEN NULL ELSE '1'::json END,
       NULL,
       CASE WHEN i %% 4000 = 5 THEN 'dep-rare' ELSE 'dep-' || (i %% 3) END,
       t, t, t, 3, NULL, NULL,
       CASE WHEN i %% 3000 = 11 THEN t END, CASE WHEN i %% 3000 = 11 THEN 'unknown_id' END,
       CASE WHEN i %% 3000 = 11 THEN 'n8n' END
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT timestamptz '2030-01-01' + i * interval '1 second' AS t) AS at
"""


def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every plan node under ``node`` that reads veracity_executions."""
    found = [node] if node.get("Relation Name") == "veracity_executions" else []
    for child in node.get("Plans", []):
        found += scans(child)
    return found


@contextmanager
def migrated_database(server_url: str) -> Iterator[str]:
    """A new database with Veracity's tables, dropped at the end."""
    from tests._pg import create_database, drop_database, with_database
    from tests.conftest import run_async
    from veracity.store import open_store

    name = f"veracity_plans_{uuid.uuid4().hex[:12]}"
    create_database(server_url, name)
    url = with_database(server_url, name)

    async def migrate() -> None:
        store = await open_store(url)
        try:
            await store.migrate()
        finally:
            await store.close()

    try:
        run_async(migrate())
        yield url
    finally:
        drop_database(server_url, name)


@pytest.fixture(scope="module")
def filled(pg_server_url: str) -> Iterator[str]:
    """One migrated database with the rows, shared by this module's tests (read only)."""
    with migrated_database(pg_server_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FILL, {"rows": ROWS})
            conn.execute("ANALYZE veracity_executions")
        yield url


def _list_plan(url: str, filter: ExecutionFilter, after: ListCursor | None = None, *,
               planning: bool = True, pending: int = 0) -> dict[str, Any]:
    """The plan (run: EXPLAIN ANALYZE) of the statement PostgresStore.execution_list sends
    for ``filter``, after its planner settings (``list_planning``) as the store runs them,
    unless ``planning`` is False; ``pending``: that many new pending rows first, unknown
    to the statistics (rolled back)."""
    query, args = list_statement(filter, limit=LIMIT, after=after)
    with psycopg.connect(url, prepare_threshold=None) as conn:
        if pending:
            _pending_unknown_to_statistics(conn, pending)
        if planning:
            conn.execute(_q("list_planning"))
        (plan,), = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + _q(query),
                                args).fetchall()
        conn.rollback()
    return cast(dict[str, Any], plan[0]["Plan"])


@pytest.mark.parametrize("after", [None, CURSOR], ids=["first page", "after a cursor"])
@pytest.mark.parametrize(("name", "filter"), FILTERS, ids=[f[0] for f in FILTERS])
def test_each_filter_reads_about_a_page_through_an_index(
    filled: str, name: str, filter: ExecutionFilter, after: ListCursor | None
) -> None:
    # the query and parameters PostgresStore.execution_list sends for this filter
    top = _list_plan(filled, filter, after)
    read = scans(top)
    assert read, f"{name}: veracity_executions is not read at all?"
    kinds = {n["Node Type"] for n in read}
    assert "Seq Scan" not in kinds, (name, kinds)
    rows_read = sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
                    for n in read)
    assert rows_read <= 10 * LIMIT, (name, rows_read, kinds)


PLANS = ["custom", "generic"]
"""How a statement is planned: ``custom``, for its values (EXPLAIN of the statement, as the
server's sessions mostly run it); ``generic``, once for any values (a worker's sessions:
``open_store(generic_plans=True)``)."""


def _subplan_names(node: dict[str, Any]) -> list[str]:
    """Every sub-plan's name under ``node`` ("InitPlan 1 (returns $1)", ...)."""
    names = [str(node["Subplan Name"])] if "Subplan Name" in node else []
    for child in node.get("Plans", []):
        names += _subplan_names(child)
    return names


def run_plan(conn: psycopg.Connection[Any], query: str, params: dict[str, Any],
             plans: str) -> dict[str, Any]:
    """Run ``query`` (in the caller's transaction) and answer its plan with what each node
    did (EXPLAIN ANALYZE's JSON "Plan"). ``generic``: the plan a session with
    ``plan_cache_mode = force_generic_plan`` runs for the prepared statement, as
    auto_explain reports it (PostgreSQL 15 cannot EXPLAIN a generic plan directly)."""
    if plans == "custom":
        (plan,), = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchall()
        top = cast(dict[str, Any], plan[0]["Plan"])
        # the values are in the plan (a parameter an InitPlan returns is the plan's own)
        own = set(re.findall(r"\$\d+", " ".join(_subplan_names(top))))
        assert not any(set(re.findall(r"\$\d+", c)) - own for c in _conditions(top)), \
            _conditions(top)
        return top
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_analyze = on",
                    "auto_explain.log_format = json", "auto_explain.log_level = notice",
                    "auto_explain.log_nested_statements = off",
                    "plan_cache_mode = force_generic_plan"):
        conn.execute(f"SET LOCAL {setting}")
    conn.execute(query, params, prepare=True)
    # a SELECT's portal ends (and its plan is reported) with the next command
    conn.execute("SET LOCAL auto_explain.log_min_duration = -1")
    plans_seen = [json.loads(n.split("plan:", 1)[1]) for n in notices if "plan:" in n]
    assert len(plans_seen) == 1, notices
    top = cast(dict[str, Any], plans_seen[0]["Plan"])
    # planned for any values: the parameters stand in its conditions as $n
    assert any("$" in c for c in _conditions(top)), _conditions(top)
    return top


def _conditions(node: dict[str, Any]) -> list[str]:
    own = [str(node[k]) for k in ("Index Cond", "Filter", "Recheck Cond") if k in node]
    return own + [c for child in node.get("Plans", []) for c in _conditions(child)]


LIST_INDEXES = {"veracity_executions_status_created",
                "veracity_executions_deployment_status_created",
                "veracity_executions_ffqn_status_created",
                "veracity_executions_flagged_created"}


@pytest.mark.parametrize("plans", PLANS)
def test_the_lists_indexes_never_serve_a_claim(filled: str, plans: str) -> None:
    """A claim on the large table, with 500 new pending rows the statistics do not know of
    (as in production, where pending rows are few among many ended ones), reads the due
    rows from veracity_executions_unfinished: none of the list's indexes, which would make
    it read every pending row, every time (and was what the planner chose, on a table of
    a million, when the status index was keyed on status itself)."""
    from datetime import timedelta

    with psycopg.connect(filled, prepare_threshold=None) as conn:
        conn.execute(
            "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
            "scheduled_at, created_at, updated_at, history_seq) "
            "SELECT gen_random_uuid(), 'bench:noop/run.fn', '[]', 'pending', 'bench', "
            "now(), now(), now(), 1 FROM generate_series(1, 500)")
        plan = run_plan(conn, _q("execution_claim"), {
            "deployment_id": "bench", "now": None, "pinned": ["bench:noop/run.fn"],
            "upgrading": [], "limit": 16, "owner": "w", "ttl": timedelta(seconds=120),
            "from_states": ["pending"]}, plans)
        conn.rollback()

    def indexes(node: dict[str, Any]) -> set[str]:
        own = {node["Index Name"]} if "Index Name" in node else set()
        return own.union(*(indexes(c) for c in node.get("Plans", [])))

    used = indexes(plan)
    assert "veracity_executions_unfinished" in used, used
    assert not used & LIST_INDEXES, used


def _rows_read(plan: dict[str, Any]) -> int:
    return sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
               for n in scans(plan))


def _pending_unknown_to_statistics(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute(
        "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
        "scheduled_at, created_at, updated_at, history_seq) "
        "SELECT gen_random_uuid(), 'bench:noop/run.fn', '[]', 'pending', 'bench', "
        "now(), now(), now(), 1 FROM generate_series(1, %(n)s)", {"n": n})


@pytest.mark.parametrize("plans", PLANS)
def test_a_claim_reads_its_batch_not_every_pending_row(filled: str, plans: str) -> None:
    """With 2,000 pending rows the statistics do not know of (they were gathered when none
    was pending, and 2,000 new rows are far under autovacuum's re-analyze threshold on a
    large table), a claim of 16 reads about 16 rows: its UPDATE finds the chosen rows by
    primary key. When its WHERE repeated the status guard on the updated table, the
    planner could prove the partial indexes' predicates from it and, believing them
    nearly empty, joined through one: every pending row read on every claim (the growth
    benchmark's claims at 1M, bench/journal.md)."""
    from datetime import timedelta

    with psycopg.connect(filled, prepare_threshold=None) as conn:
        _pending_unknown_to_statistics(conn, 2000)
        top = run_plan(conn, _q("execution_claim"), {
            "deployment_id": "bench", "now": None, "pinned": ["bench:noop/run.fn"],
            "upgrading": [], "limit": 16, "owner": "w", "ttl": timedelta(seconds=120),
            "from_states": ["pending"]}, plans)
        conn.rollback()
    assert _claimed(top) == 16
    assert _rows_read(top) <= 4 * 16, _rows_read(top)


def _running_unknown_to_statistics(conn: psycopg.Connection[Any], n: int) -> list[str]:
    rows = conn.execute(
        "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
        "scheduled_at, created_at, updated_at, started_at, history_seq, lease_owner, "
        "lease_epoch, lease_expires_at) "
        "SELECT gen_random_uuid(), 'bench:noop/run.fn', '[]', 'running', 'bench', now(), "
        "now(), now(), now(), 2, 'w' || (i %% 16), 1, now() + interval '1 hour' "
        "FROM generate_series(1, %(n)s) AS i RETURNING id, lease_owner", {"n": n}).fetchall()
    return [str(r[0]) for r in rows if r[1] == "w1"][:16]


@pytest.mark.parametrize("plans", PLANS)
@pytest.mark.parametrize("name", ["execution_leave_many_if_owned",
                                  "execution_checkpoint_many_if_owned", "lease_renew"])
def test_a_workers_batch_reads_its_rows_not_every_running_row(filled: str, name: str,
                                                              plans: str) -> None:
    """With 2,000 running rows of 16 workers the statistics do not know of, one worker's
    batch of 16 completions (or checkpoints, or lease renewals) reads about 16 rows, each
    found by primary key. When the lease fence stood bare in the WHERE, the planner read
    the status from it, joined through veracity_executions_unfinished and read every
    running row of every worker per batch (4,979 buffers for 16 rows, against 64 now)."""
    import json
    from datetime import timedelta

    with psycopg.connect(filled, prepare_threshold=None) as conn:
        ids = _running_unknown_to_statistics(conn, 2000)
        assert len(ids) == 16
        params: dict[str, Any] = {"owner": "w1", "now": None}
        if name == "execution_leave_many_if_owned":
            params["rows"] = json.dumps([[i, 1, "completed", None, "null", None, "{}"]
                                         for i in ids])
            params["from_states"] = "{running}"
        elif name == "execution_checkpoint_many_if_owned":
            params["rows"] = json.dumps([[i, 1, "step_completed", "{}"] for i in ids])
        else:
            params.update(ids=ids, epochs=[1] * 16, ttl=timedelta(seconds=120))
        top = run_plan(conn, _q(name), params, plans)
        conn.rollback()
    assert _claimed(top) >= 16  # every row of the batch written
    assert _rows_read(top) <= 4 * 16, _rows_read(top)


def _claimed(node: dict[str, Any]) -> int:
    if node.get("Node Type") == "ModifyTable":
        return int(node["Actual Rows"])
    return sum(_claimed(c) for c in node.get("Plans", []))



def test_the_stores_connections_do_not_jit(filled: str) -> None:
    """The planner turns JIT on by cost estimate alone; on a large table a list page that
    reads a few pages was estimated above jit_above_cost and spent some 240 ms compiling
    (the FFQN-prefix filter at 10M rows, bench/journal.md, Growth). The store's
    connections run without it."""
    from tests.conftest import run_async
    from veracity.store import open_store
    from veracity.store.postgres.store import PostgresStore

    async def setting() -> Any:
        store = await open_store(filled)
        try:
            assert isinstance(store, PostgresStore)
            async with store._pool.connection() as conn:
                row = await (await conn.execute("SHOW jit")).fetchone()
        finally:
            await store.close()
        return row

    row = run_async(setting())
    assert row is not None and row["jit"] == "off", row


@pytest.mark.parametrize("plans", PLANS)
@pytest.mark.parametrize("name", ["execution_expired_leases", "execution_wake_due"])
def test_a_workers_scans_read_what_is_due_not_every_row_in_that_state(
        filled: str, name: str, plans: str) -> None:
    """Lease recovery (which every worker runs) and the claim loop's timer check, with 2,000
    rows in the state they look at that are not due (leases that run for an hour, timers
    an hour away) and 16 that are, none known to the statistics: each reads about the 16
    (their partial indexes are in due order), not the 2,000."""
    with psycopg.connect(filled, prepare_threshold=None) as conn:
        status, when = (("running", "lease_expires_at") if name == "execution_expired_leases"
                        else ("blocked", "wake_at"))
        conn.execute(
            "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
            "scheduled_at, created_at, updated_at, history_seq, lease_owner, lease_epoch, "
            f"{when}) SELECT gen_random_uuid(), 'bench:noop/run.fn', '[]', %(status)s, "
            "'bench', now(), now(), now(), 2, CASE WHEN %(status)s = 'running' THEN 'w' END, "
            "1, CASE WHEN i <= 16 THEN now() - interval '1 minute' "
            "ELSE now() + interval '1 hour' END FROM generate_series(1, 2016) AS i",
            {"status": status})
        params: dict[str, Any] = {"now": None, "limit": 100}
        if name == "execution_expired_leases":
            params["terminal"] = ["completed", "failed", "failed_transient", "cancelled"]
        else:
            params["from_states"] = ["blocked"]
        top = run_plan(conn, _q(name), params, plans)
        conn.rollback()
    read = sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
               for n in scans(top) if n.get("Alias", "e") in ("e", "veracity_executions"))
    assert 16 <= read <= 4 * 16, (read, _conditions(top))


@pytest.mark.parametrize("plans", PLANS)
@pytest.mark.parametrize("name", ["execution_by_key_or_id", "execution_by_keys_or_ids"])
def test_a_key_is_found_through_the_partial_key_index(filled: str, name: str,
                                                     plans: str) -> None:
    """Since migration 0016 only the rows that have an idempotency key are in its unique
    index (veracity_executions_key, partial): a submission that finds its key taken still
    reads the one row, through that index, planned for the values or once for any."""

    with psycopg.connect(filled, prepare_threshold=None) as conn:
        conn.execute(
            "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
            "scheduled_at, created_at, updated_at, history_seq, idempotency_key) "
            "SELECT gen_random_uuid(), 'shop:orders/process.run', '[]', 'pending', 'dep-1', "
            "now(), now(), now(), 1, 'key-' || i FROM generate_series(1, 100) AS i")
        params: dict[str, Any] = (
            {"idempotency_key": "key-7", "id": uuid.uuid4()}
            if name == "execution_by_key_or_id"
            else {"keys": ["key-7", "key-8"], "ids": [uuid.uuid4()]})
        top = run_plan(conn, _q(name), params, plans)
        conn.rollback()
    found = scans(top)
    assert found and not any(n["Node Type"] == "Seq Scan" for n in found), found
    assert "veracity_executions_key" in json.dumps(top), _conditions(top)
    read = sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
               for n in found)
    assert read == (1 if name == "execution_by_key_or_id" else 2), read


def test_the_key_index_holds_only_rows_with_a_key(filled: str) -> None:
    """The unique index over keys is partial (migration 0016): the 20,000 rows without a
    key are not in it, and a key is still unique."""
    with psycopg.connect(filled) as conn:
        (definition,), = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'veracity_executions_key'"
        ).fetchall()
        assert "UNIQUE" in definition and "WHERE (idempotency_key IS NOT NULL)" in definition
        assert conn.execute(
            "SELECT count(*) FROM pg_constraint "
            "WHERE conname = 'veracity_executions_idempotency_key_key'").fetchone() == (0,)
        insert = ("INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
                  "scheduled_at, created_at, updated_at, history_seq, idempotency_key) "
                  "VALUES (gen_random_uuid(), 'a:b/c.run', '[]', 'pending', 'd', now(), "
                  "now(), now(), 1, 'same')")
        conn.execute(insert)
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(insert)
        conn.rollback()


def test_a_workers_sessions_plan_once_and_the_servers_for_each_values(filled: str) -> None:
    """``veracity worker`` opens its store with generic plans (its statements' plans are
    checked above, both ways); every other store plans for the values, which the list's
    filters need."""
    import asyncio

    from tests.conftest import run_async
    from veracity.config import load_settings
    from veracity.store import Store, open_store
    from veracity.store.postgres.store import PostgresStore
    from veracity.worker.main import open_store_patiently

    async def mode(store: Store | None) -> str:
        assert isinstance(store, PostgresStore)
        try:
            async with store._pool.connection() as conn:
                row = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
        finally:
            await store.close()
        assert row is not None
        return str(row["plan_cache_mode"])

    async def modes() -> list[str]:
        worker = await open_store_patiently(
            load_settings(env={"VERACITY_DATABASE_URL": filled}), asyncio.Event())
        return [await mode(worker), await mode(await open_store(filled)),
                await mode(await open_store(filled, generic_plans=True))]

    assert run_async(modes()) == ["force_generic_plan", "auto", "force_generic_plan"]


BATCH = 128
"""A worker's default concurrency, and so its largest claim and completion batches."""


@pytest.fixture(scope="module")
def small(pg_server_url: str) -> Iterator[str]:
    """A migrated database that got 30,000 executions since it was made, before autovacuum
    analyzed it (as a new deployment's first burst does): without statistics, reading the
    whole table looks cheap to the planner."""
    with migrated_database(pg_server_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FILL, {"rows": 30_000 - 2 * BATCH})
            _pending_unknown_to_statistics(conn, BATCH)
            conn.execute(
                "INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id, "
                "scheduled_at, created_at, updated_at, started_at, history_seq, lease_owner, "
                "lease_epoch, lease_expires_at) "
                "SELECT gen_random_uuid(), 'bench:noop/run.fn', '[]', 'running', 'bench', "
                "now(), now(), now(), now(), 2, 'w1', 1, now() + interval '1 hour' "
                "FROM generate_series(1, %(n)s)", {"n": BATCH})
        yield url


@pytest.mark.parametrize("plans", PLANS)
@pytest.mark.parametrize("name", ["execution_claim", "execution_leave_many_if_owned",
                                  "execution_checkpoint_many_if_owned"])
def test_a_full_batch_reads_its_rows_on_a_small_table(small: str, name: str,
                                                      plans: str) -> None:
    """A batch of 128 (a claim, completions, checkpoints) on a table of 30,000 rows without
    statistics reads its 128 rows by primary key (each row is counted where it is found
    and where it is written). Left to cost alone, the planner read the whole table for a
    batch of completions or checkpoints and joined it by hash: 10 to 14 ms a batch here,
    about 100 µs of the database's time per execution. (The heartbeat's lease renewal,
    once per lease_ttl / 3 and planned once by a worker, may still read the table when
    planned for its values without statistics.)"""
    import json
    from datetime import timedelta

    with psycopg.connect(small, prepare_threshold=None) as conn:
        ids = [str(r[0]) for r in conn.execute(
            "SELECT id FROM veracity_executions WHERE lease_owner = 'w1'").fetchall()]
        assert len(ids) == BATCH
        params: dict[str, Any] = {"owner": "w1", "now": None}
        if name == "execution_claim":
            params.update(deployment_id="bench", pinned=["bench:noop/run.fn"], upgrading=[],
                          limit=BATCH, ttl=timedelta(seconds=120), from_states=["pending"])
        elif name == "execution_leave_many_if_owned":
            params["rows"] = json.dumps([[i, 1, "completed", None, "null", None, "{}"]
                                         for i in ids])
            params["from_states"] = "{running}"
        elif name == "execution_checkpoint_many_if_owned":
            params["rows"] = json.dumps([[i, 1, "step_completed", "{}"] for i in ids])
        else:
            params.update(ids=ids, epochs=[1] * BATCH, ttl=timedelta(seconds=120))
        top = run_plan(conn, _q(name), params, plans)
        conn.rollback()
    assert _claimed(top) >= BATCH  # every row of the batch written
    assert not any(n["Node Type"] == "Seq Scan" for n in scans(top)), _conditions(top)
    assert _rows_read(top) <= 3 * BATCH, _rows_read(top)


def test_every_combination_answers_what_reading_every_row_would(filled: str) -> None:
    """Whichever query and index a combination is read with (the store's list_statement),
    the page is the rows that pass every filter, newest first: each combination of
    statuses, a prefix, a deployment, flagged and a date bound, its first page and the
    page after it, against the same filters checked row by row in Python over the whole
    table."""
    import itertools

    from tests.conftest import run_async
    from veracity.store import open_store

    with psycopg.connect(filled) as conn:
        table = conn.execute("SELECT id, status, ffqn, deployment_id, flagged_at, created_at "
                             "FROM veracity_executions").fetchall()
    newest = sorted(table, key=lambda r: (r[5], r[0]), reverse=True)
    statuses = [None, (Status.COMPLETED,), (Status.FAILED,), (Status.CANCELLED, Status.BLOCKED)]
    prefixes = [None, "rare:", "shop:mail", "shop:", ""]
    deployments = [None, "dep-1", "dep-rare"]
    flags = [None, True, False]
    bounds = [None, datetime(2030, 1, 1, 3, tzinfo=UTC)]

    async def pages() -> int:
        checked = 0
        store = await open_store(filled)
        try:
            for st, pre, dep, fl, before in itertools.product(statuses, prefixes, deployments,
                                                               flags, bounds):
                f = ExecutionFilter(statuses=st or (), ffqn_prefix=pre, deployment_id=dep,
                                    flagged=fl, created_before=before)
                want = [r[0] for r in newest
                        if (st is None or r[1] in {str(s) for s in st})
                        and (pre is None or r[2].startswith(pre))
                        and (dep is None or r[3] == dep)
                        and (fl is None or (r[4] is not None) == fl)
                        and (before is None or r[5] < before)]
                first = await store.execution_list(f, limit=LIMIT)
                assert [e.id for e in first] == want[:LIMIT], (st, pre, dep, fl, before)
                if len(first) == LIMIT:
                    last = first[-1]
                    second = await store.execution_list(
                        f, limit=LIMIT, after=ListCursor(last.created_at, last.id))
                    assert [e.id for e in second] == want[LIMIT:2 * LIMIT], \
                        (st, pre, dep, fl, before)
                checked += 1
        finally:
            await store.close()
        return checked

    assert run_async(pages()) == 4 * 5 * 3 * 3 * 2


NEW_ROWS = [
    ("unfiltered", ExecutionFilter()),
    ("status=pending", ExecutionFilter(statuses=(Status.PENDING,))),
    ("ffqn_prefix of the new rows", ExecutionFilter(ffqn_prefix="bench:")),
    ("deployment_id of the new rows", ExecutionFilter(deployment_id="bench")),
    ("flagged=false", ExecutionFilter(flagged=False)),
]


@pytest.mark.parametrize(("name", "filter"), NEW_ROWS, ids=[f[0] for f in NEW_ROWS])
def test_rows_newer_than_the_statistics_are_read_a_page_at_a_time(
        filled: str, name: str, filter: ExecutionFilter) -> None:
    """2,000 pending rows the statistics do not know of (a burst before autovacuum analyzed
    the table): a page still reads about a page of them, each index in order, because the
    store plans its list pages without bitmap scans (queries.sql, list_planning)."""
    top = _list_plan(filled, filter, pending=2000)
    assert _rows_read(top) <= 10 * LIMIT, (name, _rows_read(top), _conditions(top))


@contextmanager
def never_analyzed(server_url: str) -> Iterator[str]:
    """A migrated database whose 20,000 executions were never analyzed (autovacuum off for
    the table, so that it stays so): the planner knows nothing of its rows, as of a new
    deployment's first burst."""
    with migrated_database(server_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE veracity_executions SET (autovacuum_enabled = false)")
            conn.execute(FILL, {"rows": ROWS})
        yield url


@pytest.fixture(scope="module")
def unanalyzed(pg_server_url: str) -> Iterator[str]:
    with never_analyzed(pg_server_url) as url:
        yield url


@pytest.mark.parametrize(("name", "filter"), FILTERS + NEW_ROWS[1:],
                         ids=[f[0] for f in FILTERS + NEW_ROWS[1:]])
def test_a_table_never_analyzed_is_read_a_page_at_a_time(
        unanalyzed: str, name: str, filter: ExecutionFilter) -> None:
    top = _list_plan(unanalyzed, filter, pending=2000)
    assert "Seq Scan" not in {n["Node Type"] for n in scans(top)}, (name, _conditions(top))
    assert _rows_read(top) <= 10 * LIMIT, (name, _rows_read(top), _conditions(top))


def test_planned_with_bitmap_scans_a_status_was_read_whole(pg_server_url: str) -> None:
    """Why list_planning exists: planned the way PostgreSQL plans by default, the page of
    a status on a table never analyzed read every row of that status (a bitmap scan, then
    a sort), and so did the unfiltered page, which reads each status. (A database of its
    own: the other tests' rolled-back rows change the planner's guesses.)"""
    with never_analyzed(pg_server_url) as url:
        tops = [_list_plan(url, filter, planning=False) for filter in
                (ExecutionFilter(statuses=(Status.COMPLETED,)), ExecutionFilter())]
    for top in tops:
        assert _rows_read(top) >= 10_000, (_rows_read(top), _conditions(top))
        assert "Bitmap Heap Scan" in {n["Node Type"] for n in scans(top)}, _conditions(top)
