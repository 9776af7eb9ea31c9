"""An FFQN prefix shared by many workflows, on PostgreSQL (docs/operations.md, What a list
page costs): its pages, alone and with every other filter, against the filters checked
row by row (the plans of a prefix's page: test_list_plans.py). The table:
tests/store/_many_workflows.py, ANALYZEd."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.store._many_workflows import FILTERS, LIMIT, ROWS, WORKFLOWS, Row, check_pages
from tests.store.test_list_plans import migrated_database
from veracity.models import ExecutionFilter

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
