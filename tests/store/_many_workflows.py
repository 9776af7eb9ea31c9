"""The table and the checks shared by the SQLite and PostgreSQL tests of an FFQN prefix
shared by many workflows (test_sqlite_many_workflows.py, test_pg_many_workflows.py): 6,000
executions created a second apart from 2030-01-01, 40 workflows ``app:wNN/run.run``
holding 49 rows in 50, 40 ``lib:wNN/run.run`` holding 1 in 50; some failed and blocked;
flagged: every ``lib:`` row and a few others (more than ``lib:`` has, so that ``lib:``
leads a page of both); three deployments."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from tests.conftest import run_async
from veracity.core.states import Status
from veracity.models import ExecutionFilter, ListCursor
from veracity.store import open_store

LIMIT = 50
ROWS = 6_000
WORKFLOWS = 40


def at(i: int) -> datetime:
    """Row ``i``'s created_at."""
    return datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=i)


class Row(NamedTuple):
    id: str
    status: str
    ffqn: str
    deployment_id: str
    flagged: bool
    created_at: datetime


FILTERS = [
    ExecutionFilter(ffqn_prefix="app:"),
    ExecutionFilter(ffqn_prefix="lib:"),
    ExecutionFilter(ffqn_prefix="app:w1"),
    ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="app:"),
    ExecutionFilter(statuses=(Status.COMPLETED, Status.BLOCKED), ffqn_prefix="lib:"),
    ExecutionFilter(ffqn_prefix="app:", deployment_id="dep-1"),
    ExecutionFilter(ffqn_prefix="lib:", deployment_id="dep-2"),
    ExecutionFilter(ffqn_prefix="app:", flagged=True),
    ExecutionFilter(ffqn_prefix="lib:", flagged=False),
    ExecutionFilter(ffqn_prefix="lib:", flagged=True),
    ExecutionFilter(ffqn_prefix="app:", created_before=at(ROWS // 2)),
    ExecutionFilter(ffqn_prefix="lib:", created_after=at(ROWS - 900)),
    ExecutionFilter(ffqn_prefix="app:", created_after=at(ROWS - 30)),
]
"""Prefixes of many workflows, alone and with every other filter."""


def check_pages(url: str, table: list[Row], filter: ExecutionFilter, tail: int) -> None:
    """The store's first page of ``filter``, the next, the page after the row that
    ``tail`` rows are older than (deep in the list) and after the last row, each against
    the filters checked row by row over the whole ``table``."""
    newest = sorted(table, key=lambda r: (r.created_at, r.id), reverse=True)
    matching = [r for r in newest
                if (not filter.statuses or r.status in {str(s) for s in filter.statuses})
                and r.ffqn.startswith(filter.ffqn_prefix or "")
                and (filter.deployment_id is None or r.deployment_id == filter.deployment_id)
                and (filter.flagged is None or r.flagged == filter.flagged)
                and (filter.created_after is None or r.created_at > filter.created_after)
                and (filter.created_before is None or r.created_at < filter.created_before)]
    cursors: list[Row | None] = [None]
    if len(matching) > LIMIT:
        cursors.append(matching[LIMIT - 1])
    cursors += [newest[-1 - tail], newest[-1]]

    async def pages() -> None:
        store = await open_store(url)
        try:
            for row in cursors:
                after = None if row is None else ListCursor(row.created_at, uuid.UUID(row.id))
                got = [str(e.id) for e in await store.execution_list(
                    filter, limit=LIMIT, after=after)]
                want = [r.id for r in matching
                        if row is None or (r.created_at, r.id) < (row.created_at, row.id)]
                assert got == want[:LIMIT], (filter, row)
        finally:
            await store.close()

    run_async(pages())
