"""Store conformance: history is written in the same transaction as every state change
(docs/states.md, guarantee 7), shown by walking a lifecycle and by fault injection; and the database
itself refuses invalid states (the CHECK constraints). Runs against every backend, except
the last tests: PostgreSQL's one constraint of migration 0014, rule by rule."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, LiteralString

import psycopg
import pytest

from tests._helpers import pg_store_fixture
from tests.store._support import DB_ERRORS, RawSQL, assert_history_consistent, new_execution
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, ExecutionFilter, TransitionResult
from veracity.store import Store

TTL = timedelta(seconds=30)
FFQN = "app.orders.create"

pg_store = pg_store_fixture()


async def claim_one(store: Store, owner: str = "worker-a") -> Claim:
    (c,) = await store.execution_claim(owner, [FFQN], limit=1, lease_ttl=TTL)
    return Claim(c.id, owner, c.lease_epoch)


async def test_every_state_change_appends_one_event(store: Store, clock: ManualClock) -> None:
    new = new_execution(FFQN, [1])
    await store.execution_submit(new)
    ev = await assert_history_consistent(store, new.id)
    assert [e.kind for e in ev] == ["pending"]

    clock.advance(1)
    first = await claim_one(store, "worker-a")
    ev = await assert_history_consistent(store, new.id)
    assert [e.kind for e in ev][-1:] == ["running"] and len(ev) == 2

    clock.advance(1)
    assert (await store.execution_release_if_owned(first, "drain")).applied
    ev = await assert_history_consistent(store, new.id)
    assert ev[-1].kind == "pending" and len(ev) == 3

    clock.advance(1)
    second = await claim_one(store, "worker-b")
    ev = await assert_history_consistent(store, new.id)
    assert ev[-1].kind == "running" and len(ev) == 4

    clock.advance(1)
    refused = await store.execution_complete_if_owned(first, "stale")  # old epoch
    assert not refused.applied
    ev = await assert_history_consistent(store, new.id)
    assert ev[-1].kind == "late_report" and len(ev) == 5

    clock.advance(1)
    assert (await store.execution_fail_if_owned(second, {"e": "x"}, transient=True)).applied
    ev = await assert_history_consistent(store, new.id)
    assert ev[-1].kind == "failed_transient" and len(ev) == 6

    clock.advance(1)
    assert not (await store.execution_complete_if_owned(second, "too late")).applied
    ev = await assert_history_consistent(store, new.id)
    assert [e.kind for e in ev] == [
        "pending",
        "running",
        "pending",
        "running",
        "late_report",
        "failed_transient",
        "late_report",
    ]
    # each state event carries the time of the change
    got = await store.execution_get(new.id)
    assert got is not None and got.status == Status.FAILED_TRANSIENT
    assert ev[5].at == got.updated_at


# -- fault injection: a history insert that fails undoes the state change -----------------


async def test_submit_fails_whole_when_history_insert_fails(store: Store, raw: RawSQL) -> None:
    existing = new_execution(FFQN)
    await store.execution_submit(existing)
    new = new_execution(FFQN, idempotency_key="key-boom")
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_submit(new)

    assert await store.execution_get(new.id) is None
    rows = await store.execution_list(ExecutionFilter(), limit=10)
    assert [r.id for r in rows] == [existing.id]
    # the idempotency key was not taken: submitting again creates the execution
    again = await store.execution_submit(new)
    assert again.created is True
    assert again.execution.id == new.id
    await assert_history_consistent(store, new.id)


async def test_claim_fails_whole_when_history_insert_fails(
    store: Store, raw: RawSQL, clock: ManualClock
) -> None:
    new = new_execution(FFQN)
    await store.execution_submit(new)
    before = await store.execution_get(new.id)
    history_before = await store.history_list(new.id)
    clock.advance(1)
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_claim("worker-a", [FFQN], limit=10, lease_ttl=TTL)

    after = await store.execution_get(new.id)
    assert after == before
    assert after is not None
    assert after.status == Status.PENDING and after.lease_owner is None
    assert await store.history_list(new.id) == history_before
    # claimable again, with the next epoch and the next seq: no gap was left behind
    c = await claim_one(store, "worker-a")
    assert c.epoch == 1
    ev = await assert_history_consistent(store, new.id)
    assert [e.seq for e in ev] == [1, 2]


Op = Callable[[Store, Claim], Awaitable[TransitionResult]]

OWNED_OPS: dict[str, tuple[Op, Status]] = {
    "complete": (lambda s, c: s.execution_complete_if_owned(c, {"r": 1}), Status.COMPLETED),
    "fail": (lambda s, c: s.execution_fail_if_owned(c, {"e": 1}), Status.FAILED),
    "fail_transient": (
        lambda s, c: s.execution_fail_if_owned(c, {"e": 1}, transient=True),
        Status.FAILED_TRANSIENT,
    ),
    "release": (lambda s, c: s.execution_release_if_owned(c, "r"), Status.PENDING),
}


@pytest.mark.parametrize("op", list(OWNED_OPS))
async def test_fenced_write_fails_whole_when_history_insert_fails(
    store: Store, raw: RawSQL, clock: ManualClock, op: str
) -> None:
    call, status = OWNED_OPS[op]
    new = new_execution(FFQN)
    await store.execution_submit(new)
    c = await claim_one(store)
    before = await store.execution_get(new.id)
    history_before = await store.history_list(new.id)
    clock.advance(1)
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await call(store, c)

    after = await store.execution_get(new.id)
    assert after == before  # still running, same owner, epoch and lease
    assert after is not None
    assert after.status == Status.RUNNING
    assert await store.history_list(new.id) == history_before
    # the same write, once history accepts inserts again, applies with the next seq
    tr = await call(store, c)
    assert tr.applied is True
    assert tr.execution is not None and tr.execution.status == status
    ev = await assert_history_consistent(store, new.id)
    assert [e.seq for e in ev] == [1, 2, 3]


async def test_late_report_fails_whole_when_history_insert_fails(store: Store, raw: RawSQL) -> None:
    new = new_execution(FFQN)
    await store.execution_submit(new)
    c = await claim_one(store)
    intruder = Claim(c.execution_id, "worker-b", c.epoch)
    before = await store.execution_get(new.id)
    history_before = await store.history_list(new.id)
    # a refused report that cannot be kept must not be answered as if it were kept
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_complete_if_owned(intruder, "x")
    assert await store.execution_get(new.id) == before
    assert await store.history_list(new.id) == history_before

    tr = await store.execution_complete_if_owned(intruder, "x")
    assert tr.applied is False
    ev = await assert_history_consistent(store, new.id)
    assert [(e.seq, e.kind) for e in ev] == [(1, "pending"), (2, "running"), (3, "late_report")]


# -- the database enforces states ---------------------------------------------------------


async def _running_execution(store: Store) -> uuid.UUID:
    new = new_execution(FFQN)
    await store.execution_submit(new)
    await claim_one(store)
    return new.id


async def test_database_rejects_an_unknown_status(store: Store, raw: RawSQL) -> None:
    execution_id = await _running_execution(store)
    before = await store.execution_get(execution_id)
    with pytest.raises(DB_ERRORS):
        raw.execute(
            "UPDATE veracity_executions SET status = 'bogus' WHERE id = ?", [str(execution_id)]
        )
    assert await store.execution_get(execution_id) == before
    assert (
        raw.scalar("SELECT status FROM veracity_executions WHERE id = ?", [str(execution_id)])
        == "running"
    )


@pytest.mark.parametrize("status", [str(s) for s in Status])
async def test_database_accepts_exactly_the_known_statuses(
    store: Store, raw: RawSQL, status: str
) -> None:
    """The CHECK lists the members of Status: each one is accepted by the database."""
    new = new_execution(FFQN)
    await store.execution_submit(new)
    # a paused execution must say where it returns to (CHECK paused_has_origin)
    raw.execute(
        "UPDATE veracity_executions SET status = ?, result = '1', paused_from = 'pending' "
        "WHERE id = ?",
        [status, str(new.id)],
    )
    got = await store.execution_get(new.id)
    assert got is not None and got.status == Status(status)


async def test_database_rejects_completed_without_result(store: Store, raw: RawSQL) -> None:
    execution_id = await _running_execution(store)
    before = await store.execution_get(execution_id)
    with pytest.raises(DB_ERRORS):
        raw.execute(
            "UPDATE veracity_executions SET status = 'completed', result = NULL, "
            "lease_owner = NULL, lease_expires_at = NULL WHERE id = ?",
            [str(execution_id)],
        )
    assert await store.execution_get(execution_id) == before


async def test_database_rejects_a_lease_outside_running(store: Store, raw: RawSQL) -> None:
    execution_id = await _running_execution(store)
    before = await store.execution_get(execution_id)
    with pytest.raises(DB_ERRORS):  # a pending execution cannot keep its lease owner
        raw.execute(
            "UPDATE veracity_executions SET status = 'pending' WHERE id = ?",
            [str(execution_id)],
        )
    assert await store.execution_get(execution_id) == before


async def test_database_rejects_duplicate_history_seq(store: Store, raw: RawSQL) -> None:
    new = new_execution(FFQN)
    await store.execution_submit(new)
    at: Any = raw.scalar("SELECT at FROM veracity_history WHERE execution_id = ?", [str(new.id)])
    with pytest.raises(DB_ERRORS):
        raw.execute(
            "INSERT INTO veracity_history (execution_id, seq, kind, at, data) "
            "VALUES (?, 1, 'pending', ?, '{}')",
            [str(new.id), at],
        )
    assert len(await store.history_list(new.id)) == 1


async def _execution(store: Store, running: bool) -> uuid.UUID:
    """A running execution, or a pending one."""
    if running:
        return await _running_execution(store)
    new = new_execution(FFQN)
    await store.execution_submit(new)
    return new.id


# The rules about states that SQLite enforces by triggers (its migration 0014) and
# PostgreSQL by its constraint: (rule, SET clause, running?).
STATE_RULES: list[tuple[str, LiteralString, bool]] = [
    ("paused_has_origin", "status = 'paused'", False),
    ("flag_kind_with_flag", "flag_kind = 'forced'", False),
    ("delegated_has_no_lease", "engine = 'n8n'", True),
]


@pytest.mark.parametrize(("rule", "change", "running"), STATE_RULES,
                         ids=[r[0] for r in STATE_RULES])
async def test_database_refuses_each_state_rule_by_its_name(
    store: Store, raw: RawSQL, rule: str, change: LiteralString, running: bool
) -> None:
    execution_id = await _execution(store, running)
    before = await store.execution_get(execution_id)
    with pytest.raises(DB_ERRORS, match=rule):
        raw.execute(
            "UPDATE veracity_executions SET " + change + " WHERE id = ?",
            [str(execution_id)],
        )
    assert await store.execution_get(execution_id) == before


# The same rules broken by an INSERT: a copy of a pending row with these columns changed.
STATE_RULE_ROWS: list[tuple[str, LiteralString]] = [
    ("paused_has_origin", "'paused', NULL, NULL, NULL, NULL"),
    ("flag_kind_with_flag", "'pending', NULL, 'forced', NULL, NULL"),
    ("delegated_has_no_lease", "'running', NULL, NULL, 'n8n', 'worker-a'"),
]


@pytest.mark.parametrize(("rule", "values"), STATE_RULE_ROWS,
                         ids=[r[0] for r in STATE_RULE_ROWS])
async def test_database_refuses_a_new_row_breaking_a_state_rule(
    store: Store, raw: RawSQL, rule: str, values: LiteralString
) -> None:
    new = new_execution(FFQN)
    await store.execution_submit(new)
    copy = uuid.uuid4()
    with pytest.raises(DB_ERRORS, match=rule):
        raw.execute(
            "INSERT INTO veracity_executions (id, ffqn, params, attempt, deployment_id, "
            "scheduled_at, created_at, updated_at, history_seq, status, paused_from, "
            "flag_kind, engine, lease_owner) "
            "SELECT ?, ffqn, params, attempt, deployment_id, scheduled_at, created_at, "
            "updated_at, history_seq, " + values + " FROM veracity_executions WHERE id = ?",
            [str(copy), str(new.id)],
        )
    assert await store.execution_get(copy) is None


# Each rule of veracity_executions, broken alone by one UPDATE (on a pending execution, or
# on a running one where the rule is about leases): (rule, SET clause, running?).
RULES: list[tuple[str, LiteralString, bool]] = [
    ("veracity_executions_status_check", "status = 'bogus'", False),
    ("veracity_executions_paused_from_check", "status = 'paused', paused_from = 'running'", False),
    ("veracity_executions_attempt_check", "attempt = 0", False),
    ("veracity_executions_deployment_id_check", "deployment_id = ''", False),
    ("veracity_executions_engine_check", "engine = ''", False),
    ("veracity_executions_external_execution_id_check", "external_execution_id = ''", False),
    ("veracity_executions_ffqn_check", "ffqn = ''", False),
    ("veracity_executions_flag_kind_check", "flag_kind = 'bogus', flagged_at = now()", False),
    ("veracity_executions_idempotency_key_check", "idempotency_key = ''", False),
    ("veracity_executions_join_set_check", "join_set = ''", False),
    ("veracity_executions_params_check", "params = '{}'", False),
    ("completed_has_result", "status = 'completed', result = NULL", False),
    ("delegated_has_no_lease", "engine = 'n8n'", True),
    ("flag_kind_with_flag", "flag_kind = 'forced'", False),
    ("lease_only_when_running", "status = 'pending'", True),
    ("paused_has_origin", "status = 'paused'", False),
]


@pytest.mark.parametrize(("rule", "change", "running"), RULES, ids=[r[0] for r in RULES])
async def test_postgres_refuses_each_rule_by_its_name(
    pg_store: Store, pg_url: str, rule: str, change: LiteralString, running: bool
) -> None:
    """On PostgreSQL the rules are one constraint calling veracity_execution_valid
    (migration 0014, docs/states.md): each broken rule is still refused as a
    check_violation that names it, and changes nothing. (SQLite's own CHECKs: above.)"""
    execution_id = await _execution(pg_store, running)
    before = await pg_store.execution_get(execution_id)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            conn.execute(
                b"UPDATE veracity_executions SET " + change.encode() + b" WHERE id = %s",
                [execution_id],
            )
    assert refused.value.diag.constraint_name == rule
    assert refused.value.diag.table_name == "veracity_executions"
    assert f'violates check constraint "{rule}"' in str(refused.value)
    assert await pg_store.execution_get(execution_id) == before


def test_postgres_has_one_check_on_executions(pg_url: str) -> None:
    """Every CHECK of veracity_executions costs its parsing on every statement that writes
    the table: the rules live in one (migration 0014), and each is tested above."""
    names = RawSQL(pg_url).execute(
        "SELECT conname FROM pg_constraint "
        "WHERE conrelid = 'veracity_executions'::regclass AND contype = 'c'"
    )
    assert names == [("veracity_executions_valid",)]
