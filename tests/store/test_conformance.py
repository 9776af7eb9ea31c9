"""Store conformance: schema, submission, reads and listing.

Runs unchanged against every backend (``database_url`` is parametrized). The rest of the
suite: the claim and fenced writes in ``test_leases.py``; atomicity, fault injection and
what the database itself enforces in ``test_integrity.py``; races between store instances
in ``test_concurrency.py``; batched completions, checkpoints, lease renewal, recovery and
the worker registry in ``test_worker_support.py``; single-runner locks and notifications
in ``test_coordination.py``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from tests.store._support import (
    DB_ERRORS,
    RawSQL,
    StoreFactory,
    assert_history_consistent,
    new_execution,
)
from veracity.clock import DatabaseClock, ManualClock
from veracity.core.states import Status
from veracity.models import Claim, Execution, ExecutionFilter, ListCursor
from veracity.store import Store, open_store
from veracity.store._sql import load_migrations

TTL = timedelta(seconds=30)

NESTED_PARAMS = [
    {"name": "Zoë", "city": "Zürich", "greeting": "こんにちは 🎉", "tags": ["λ", "Ж"]},
    [1, -2, 2.5, 12345678901234567890, None, True, False],
    {"deep": {"deeper": {"deepest": [{"k": "v"}, [], {}]}}, "empty": ""},
    'plain string with "quotes", \\backslashes\\ and\nnewlines\ttabs',
    0,
    None,
]


def all_versions(backend: str) -> list[int]:
    package = "veracity.store.postgres" if backend == "postgresql" else "veracity.store.sqlite"
    return [m.version for m in load_migrations(package)]


# -- schema ---------------------------------------------------------------------------


async def test_migrate_again_applies_nothing(store: Store, raw: RawSQL, backend: str) -> None:
    assert store.backend == backend
    assert await store.migrate() == []
    assert await store.migrate() == []
    assert raw.migration_versions() == all_versions(backend)


async def test_migrate_on_empty_database_applies_every_version_once(
    empty_database_url: str, clock: ManualClock, backend: str
) -> None:
    s = await open_store(empty_database_url, clock=clock, pool_size=1)
    try:
        assert await s.migrate() == all_versions(backend)
        assert await s.migrate() == []
        # the schema is usable
        submitted = await s.execution_submit(new_execution())
        assert submitted.created
    finally:
        await s.close()
    assert RawSQL(empty_database_url).migration_versions() == all_versions(backend)


async def test_a_store_connected_directly_keeps_its_sessions(store: Store) -> None:
    """check_session passes at once on a direct connection (on PostgreSQL its notification
    arrives within milliseconds); through a pooler in transaction mode it refuses
    (tests/pooler/test_pgbouncer.py)."""
    started = time.monotonic()
    await store.check_session()
    assert time.monotonic() - started < 2


async def test_ping_answers_while_open_and_raises_once_closed(
    store: Store, database_url: str, clock: ManualClock
) -> None:
    await store.ping()  # raises if the database does not answer
    s = await open_store(database_url, clock=clock, pool_size=1)
    await s.ping()
    await s.close()
    with pytest.raises((*DB_ERRORS, RuntimeError)):
        await s.ping()
    await store.ping()  # another instance closing does not affect this one


# -- submit ---------------------------------------------------------------------------


async def test_submit_records_a_pending_execution(store: Store, clock: ManualClock) -> None:
    new = new_execution("app.orders.create", NESTED_PARAMS, deployment_id="dep-7")
    submitted = await store.execution_submit(new)

    assert submitted.created is True
    ex = submitted.execution
    assert ex.id == new.id
    assert ex.ffqn == "app.orders.create"
    assert ex.params == NESTED_PARAMS
    assert ex.status == Status.PENDING
    assert ex.attempt == 1
    assert ex.deployment_id == "dep-7"
    assert ex.parent_id is None
    assert ex.idempotency_key is None
    assert ex.result is None
    assert ex.error is None
    assert ex.scheduled_at == clock.now()
    assert ex.created_at == clock.now()
    assert ex.updated_at == clock.now()
    assert ex.lease_owner is None
    assert ex.lease_expires_at is None
    assert ex.lease_epoch == 0
    # what submit returned is what is stored
    assert await store.execution_get(new.id) == ex


@pytest.mark.parametrize("kind", ["plain", "paused", "scheduled", "keyed", "child"])
@pytest.mark.parametrize("time_from", ["clock", "database"])
async def test_what_submit_answers_is_the_stored_row(
    store: Store, open_extra_store: StoreFactory, kind: str, time_from: str
) -> None:
    """The answer is built from what was sent and the times the database chose, not read
    back whole (the store's ``submitted_execution``): for every kind of submission, with
    the store's clock and with the database's, it must equal the stored row."""
    target = store if time_from == "clock" else await open_extra_store(clock_=DatabaseClock())
    parent = (await target.execution_submit(new_execution("app.parent"))).execution
    later = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    new = {
        "plain": new_execution(params=NESTED_PARAMS),
        "paused": dataclasses.replace(new_execution(), paused=True),
        "scheduled": new_execution(scheduled_at=later),
        "keyed": new_execution(idempotency_key="key-7", request_digest="digest-7"),
        "child": dataclasses.replace(new_execution("app.child", [1]), parent_id=parent.id,
                                     join_set="js-1"),
    }[kind]
    submitted = await target.execution_submit(new)
    assert submitted.created
    assert submitted.execution == await target.execution_get(new.id)
    assert submitted.execution.status == (Status.PAUSED if kind == "paused" else Status.PENDING)


async def test_submit_params_round_trip_nested_json_and_unicode(store: Store) -> None:
    new = new_execution(params=NESTED_PARAMS)
    await store.execution_submit(new)
    got = await store.execution_get(new.id)
    assert got is not None
    assert got.params == NESTED_PARAMS
    assert type(got.params[1][3]) is int  # a big integer stays an exact integer
    assert type(got.params[1][2]) is float


@pytest.mark.parametrize("number", [1e100, 1e16, 1e22, 2.5e-8, 0.1, 2.0, 2**70], ids=str)
async def test_json_numbers_round_trip_with_value_and_type(store: Store, number: Any) -> None:
    """A float stays a float of the same value, an int an int, in params and results."""
    new = new_execution(params=[number, {"n": number}])
    await store.execution_submit(new)
    got = await store.execution_get(new.id)
    assert got is not None
    assert got.params == [number, {"n": number}]
    assert [type(got.params[0]), type(got.params[1]["n"])] == [type(number)] * 2

    (claimed,) = await store.execution_claim("w", [new.ffqn], limit=1, lease_ttl=TTL)
    tr = await store.execution_complete_if_owned(Claim(new.id, "w", claimed.lease_epoch), number)
    assert tr.applied
    assert tr.execution is not None
    assert tr.execution.result == number
    assert type(tr.execution.result) is type(number)


async def test_json_strings_with_nul_characters_round_trip(store: Store) -> None:
    """Whatever a workflow is given or returns is stored as given, NUL characters too."""
    text = "before\x00after"
    new = new_execution(params=[text, {"k\x00": text}])
    await store.execution_submit(new)
    got = await store.execution_get(new.id)
    assert got is not None and got.params == [text, {"k\x00": text}]

    (claimed,) = await store.execution_claim("w", [new.ffqn], limit=1, lease_ttl=TTL)
    tr = await store.execution_complete_if_owned(Claim(new.id, "w", claimed.lease_epoch), text)
    assert tr.applied
    assert tr.execution is not None and tr.execution.result == text


@pytest.mark.parametrize("where", ["scheduled_at", "created_after", "created_before", "cursor"])
async def test_naive_datetimes_are_refused(store: Store, where: str) -> None:
    """A time without a timezone is ambiguous: the store refuses it instead of guessing."""
    naive = datetime(2030, 1, 1, 12, 0)
    existing = await _submit(store)
    with pytest.raises(ValueError, match="naive"):
        if where == "scheduled_at":
            await store.execution_submit(new_execution(scheduled_at=naive))
        elif where == "created_after":
            await store.execution_list(ExecutionFilter(created_after=naive), limit=10)
        elif where == "created_before":
            await store.execution_list(ExecutionFilter(created_before=naive), limit=10)
        else:
            await store.execution_list(
                ExecutionFilter(), limit=10, after=ListCursor(naive, existing.id)
            )
    rows = await store.execution_list(ExecutionFilter(), limit=10)
    assert [r.id for r in rows] == [existing.id]


async def test_submit_writes_pending_event_with_its_data(store: Store, clock: ManualClock) -> None:
    parent = new_execution("app.parent")
    await store.execution_submit(parent)
    new = new_execution(
        "app.child",
        [{"x": "ü"}],
        deployment_id="dep-2",
        idempotency_key="key-1",
        parent_id=parent.id,
    )
    ex = (await store.execution_submit(new)).execution

    events = await store.history_list(new.id)
    assert len(events) == 1
    (event,) = events
    assert event.execution_id == new.id
    assert event.seq == 1
    assert event.kind == "pending"
    assert event.at == clock.now()
    data = event.data
    assert data["ffqn"] == "app.child"
    assert data["params"] == [{"x": "ü"}]
    assert data["deployment_id"] == "dep-2"
    assert data["idempotency_key"] == "key-1"
    assert data["parent_id"] == str(parent.id)
    assert datetime.fromisoformat(data["scheduled_at"]) == ex.scheduled_at
    await assert_history_consistent(store, new.id)


async def test_submit_keeps_parent_id(store: Store) -> None:
    parent = new_execution("app.parent")
    await store.execution_submit(parent)
    child = new_execution("app.child", parent_id=parent.id)
    ex = (await store.execution_submit(child)).execution
    assert ex.parent_id == parent.id
    got = await store.execution_get(child.id)
    assert got is not None and got.parent_id == parent.id


async def test_submit_with_unknown_parent_is_refused(store: Store) -> None:
    orphan = new_execution("app.child", parent_id=uuid.uuid4())
    with pytest.raises(DB_ERRORS):
        await store.execution_submit(orphan)
    assert await store.execution_get(orphan.id) is None


async def test_submit_explicit_future_scheduled_at(store: Store, clock: ManualClock) -> None:
    later = clock.now() + timedelta(hours=3, microseconds=123457)
    new = new_execution(scheduled_at=later)
    ex = (await store.execution_submit(new)).execution
    assert ex.scheduled_at == later
    assert ex.created_at == clock.now()
    got = await store.execution_get(new.id)
    assert got is not None and got.scheduled_at == later


async def test_submit_scheduled_at_in_another_timezone_is_the_same_instant(
    store: Store, clock: ManualClock
) -> None:
    plus_two = timezone(timedelta(hours=2))
    when = (clock.now() + timedelta(minutes=5)).astimezone(plus_two)
    ex = (await store.execution_submit(new_execution(scheduled_at=when))).execution
    assert ex.scheduled_at == when
    assert ex.scheduled_at.utcoffset() == timedelta(0)


async def test_submit_same_idempotency_key_twice_creates_one_execution(
    store: Store, clock: ManualClock
) -> None:
    first = new_execution(idempotency_key="order-42", request_digest="digest-a")
    s1 = await store.execution_submit(first)
    clock.advance(5)
    second = new_execution("app.other", [1], idempotency_key="order-42", request_digest="digest-b")
    s2 = await store.execution_submit(second)

    assert s1.created is True
    assert s1.request_digest == "digest-a"
    assert s2.created is False
    assert s2.execution == s1.execution  # the stored execution, unchanged
    assert s2.request_digest == "digest-a"  # the stored digest, not the new one
    assert await store.execution_get(second.id) is None
    rows = await store.execution_list(ExecutionFilter(), limit=100)
    assert [r.id for r in rows] == [first.id]
    assert len(await store.history_list(first.id)) == 1


async def test_submit_without_idempotency_key_always_creates(store: Store) -> None:
    a = await store.execution_submit(new_execution())
    b = await store.execution_submit(new_execution())
    c = await store.execution_submit(new_execution(idempotency_key="k1"))
    d = await store.execution_submit(new_execution(idempotency_key="k2"))
    assert all(s.created for s in (a, b, c, d))
    assert len(await store.execution_list(ExecutionFilter(), limit=100)) == 4


async def test_submit_idempotency_key_returns_execution_in_its_current_state(
    store: Store,
) -> None:
    first = new_execution(idempotency_key="k")
    await store.execution_submit(first)
    (claimed,) = await store.execution_claim("w", [first.ffqn], limit=1, lease_ttl=TTL)
    again = await store.execution_submit(new_execution(idempotency_key="k"))
    assert again.created is False
    assert again.execution == claimed
    assert again.execution.status == Status.RUNNING


# -- get ------------------------------------------------------------------------------


async def test_get_unknown_id_is_none(store: Store) -> None:
    await store.execution_submit(new_execution())
    assert await store.execution_get(uuid.uuid4()) is None


# -- list -----------------------------------------------------------------------------


async def _submit(store: Store, ffqn: str = "app.wf", *, deployment_id: str = "dep-1") -> Execution:
    new = new_execution(ffqn, deployment_id=deployment_id)
    return (await store.execution_submit(new)).execution


async def test_list_newest_first(store: Store, clock: ManualClock) -> None:
    made = []
    for _ in range(4):
        made.append(await _submit(store))
        clock.advance(1)
    rows = await store.execution_list(ExecutionFilter(), limit=10)
    assert [r.id for r in rows] == [e.id for e in reversed(made)]
    assert rows == list(reversed(made))


async def test_list_same_created_at_orders_by_id_descending(store: Store) -> None:
    made = [await _submit(store) for _ in range(6)]  # the clock stands still
    rows = await store.execution_list(ExecutionFilter(), limit=10)
    assert [r.id for r in rows] == sorted((e.id for e in made), reverse=True)


async def test_list_limit(store: Store) -> None:
    for _ in range(5):
        await _submit(store)
    assert len(await store.execution_list(ExecutionFilter(), limit=3)) == 3
    assert len(await store.execution_list(ExecutionFilter(), limit=5)) == 5
    assert len(await store.execution_list(ExecutionFilter(), limit=50)) == 5


async def test_list_empty_store(store: Store) -> None:
    assert await store.execution_list(ExecutionFilter(), limit=10) == []


async def test_list_filter_statuses(store: Store, clock: ManualClock) -> None:
    pending = await _submit(store, "app.pending")
    running = await _submit(store, "app.running")
    completed = await _submit(store, "app.completed")
    failed = await _submit(store, "app.failed")
    for ex in (running, completed, failed):
        (c,) = await store.execution_claim("w", [ex.ffqn], limit=1, lease_ttl=TTL)
        claim = Claim(c.id, "w", c.lease_epoch)
        if ex is completed:
            assert (await store.execution_complete_if_owned(claim, {"ok": 1})).applied
        if ex is failed:
            assert (await store.execution_fail_if_owned(claim, {"e": 1})).applied

    async def ids(*statuses: Status) -> set[uuid.UUID]:
        rows = await store.execution_list(ExecutionFilter(statuses=statuses), limit=10)
        assert all(r.status in statuses for r in rows)
        return {r.id for r in rows}

    assert await ids(Status.PENDING) == {pending.id}
    assert await ids(Status.RUNNING) == {running.id}
    assert await ids(Status.COMPLETED, Status.FAILED) == {completed.id, failed.id}
    assert await ids(Status.CANCELLED) == set()
    assert await ids(*Status) == {pending.id, running.id, completed.id, failed.id}


async def test_list_pages_of_several_workflows_or_statuses_merge_newest_first(
    store: Store, clock: ManualClock
) -> None:
    """A filter whose rows come from several workflows (an FFQN prefix) or several statuses
    (PostgreSQL reads each one's newest rows, then merges them): pages in one order,
    newest first, nothing repeated or skipped across pages."""
    made = []
    for i in range(9):
        clock.advance(1)
        made.append(await _submit(store, ["app.a.run", "app.b.run", "other.c.run"][i % 3]))
    # the oldest of app.b.run (made[1]) fails: the others stay pending
    (c,) = await store.execution_claim("w", ["app.b.run"], limit=1,
                                       lease_ttl=timedelta(seconds=30))
    assert c.id == made[1].id
    assert (await store.execution_fail_if_owned(Claim(c.id, "w", c.lease_epoch),
                                                {"code": "x"})).applied

    async def pages(f: ExecutionFilter) -> list[uuid.UUID]:
        seen: list[uuid.UUID] = []
        after = None
        while True:
            rows = await store.execution_list(f, limit=2, after=after)
            seen += [r.id for r in rows]
            if len(rows) < 2:
                return seen
            after = ListCursor(rows[-1].created_at, rows[-1].id)

    newest_first = [e.id for e in reversed(made)]
    assert await pages(ExecutionFilter(ffqn_prefix="app.")) == [
        e for e, m in zip(newest_first, reversed(made), strict=True)
        if m.ffqn.startswith("app.")]
    assert await pages(ExecutionFilter(statuses=(Status.FAILED, Status.PENDING))) == (
        newest_first)
    assert await pages(ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="app.")) == [
        made[1].id]


async def test_list_filter_ffqn_prefix_is_literal(store: Store) -> None:
    names = [
        "shop.orders.create",
        "shop.orders.cancel",
        "shop.ordersx.v2",
        "shop_payments.charge",
        "shopXpayments.charge",
        "billing.invoice",
    ]
    by_name = {n: (await _submit(store, n)).id for n in names}

    async def found(prefix: str) -> set[str]:
        rows = await store.execution_list(ExecutionFilter(ffqn_prefix=prefix), limit=50)
        return {r.ffqn for r in rows}

    assert await found("shop.orders.") == {"shop.orders.create", "shop.orders.cancel"}
    assert await found("shop.orders") == {
        "shop.orders.create",
        "shop.orders.cancel",
        "shop.ordersx.v2",
    }
    # LIKE wildcards in a prefix are plain characters
    assert await found("shop_") == {"shop_payments.charge"}
    assert await found("shop%") == set()
    assert await found("billing.invoice") == {"billing.invoice"}
    assert await found("Shop.") == set()  # case-sensitive
    assert await found("") == set(by_name)


async def test_list_filter_deployment_id(store: Store) -> None:
    a1 = await _submit(store, deployment_id="dep-a")
    a2 = await _submit(store, deployment_id="dep-a")
    b = await _submit(store, deployment_id="dep-b")
    rows = await store.execution_list(ExecutionFilter(deployment_id="dep-a"), limit=10)
    assert {r.id for r in rows} == {a1.id, a2.id}
    rows = await store.execution_list(ExecutionFilter(deployment_id="dep-b"), limit=10)
    assert [r.id for r in rows] == [b.id]
    assert await store.execution_list(ExecutionFilter(deployment_id="dep-c"), limit=10) == []


async def test_list_filter_created_after_and_before(store: Store, clock: ManualClock) -> None:
    t0 = clock.now()
    a = await _submit(store)
    t1 = clock.advance(10)
    b = await _submit(store)
    t2 = clock.advance(10)
    c = await _submit(store)
    half = timedelta(seconds=5)

    async def ids(
        created_after: datetime | None = None, created_before: datetime | None = None
    ) -> list[uuid.UUID]:
        f = ExecutionFilter(created_after=created_after, created_before=created_before)
        return [r.id for r in await store.execution_list(f, limit=10)]

    assert await ids(created_after=t0 + half) == [c.id, b.id]
    assert await ids(created_before=t1 + half) == [b.id, a.id]
    assert await ids(created_after=t0 + half, created_before=t1 + half) == [b.id]
    assert await ids(created_after=t2 + half) == []
    assert await ids(created_before=t0 - half) == []
    # both bounds are exclusive
    assert await ids(created_after=t1) == [c.id]
    assert await ids(created_before=t1) == [a.id]
    assert await ids(created_after=t0, created_before=t2) == [b.id]


async def test_list_filters_combine(store: Store, clock: ManualClock) -> None:
    keep = await _submit(store, "app.x.one", deployment_id="dep-a")
    await _submit(store, "app.x.two", deployment_id="dep-b")
    await _submit(store, "app.y.one", deployment_id="dep-a")
    f = ExecutionFilter(
        statuses=(Status.PENDING,),
        ffqn_prefix="app.x.",
        deployment_id="dep-a",
        created_after=clock.now() - timedelta(seconds=1),
        created_before=clock.now() + timedelta(seconds=1),
    )
    assert [r.id for r in await store.execution_list(f, limit=10)] == [keep.id]


async def test_list_keyset_pagination_has_no_duplicates_and_no_gaps(
    store: Store, clock: ManualClock
) -> None:
    made: list[Execution] = []
    for i in range(25):
        made.append(await _submit(store))
        if i % 3 == 2:  # groups of three share a created_at: the id breaks ties
            clock.advance(1)
    expected = [e.id for e in sorted(made, key=lambda e: (e.created_at, e.id), reverse=True)]
    everything = await store.execution_list(ExecutionFilter(), limit=100)
    assert [r.id for r in everything] == expected

    pages: list[list[uuid.UUID]] = []
    cursor: ListCursor | None = None
    while True:
        page = await store.execution_list(ExecutionFilter(), limit=7, after=cursor)
        if not page:
            break
        pages.append([r.id for r in page])
        cursor = ListCursor(page[-1].created_at, page[-1].id)
        # rows submitted while paging are newer than the cursor: they never show up
        clock.advance(1)
        await _submit(store)
    assert [len(p) for p in pages] == [7, 7, 7, 4]
    flat = [i for p in pages for i in p]
    assert len(flat) == len(set(flat))
    assert flat == expected


async def test_list_keyset_pagination_with_a_filter(store: Store, clock: ManualClock) -> None:
    wanted = []
    for i in range(12):
        ex = await _submit(store, "app.keep" if i % 2 else "app.drop")
        if i % 2:
            wanted.append(ex)
        if i % 4 == 0:
            clock.advance(1)
    expected = [e.id for e in sorted(wanted, key=lambda e: (e.created_at, e.id), reverse=True)]
    f = ExecutionFilter(ffqn_prefix="app.keep")
    got: list[uuid.UUID] = []
    cursor: ListCursor | None = None
    while page := await store.execution_list(f, limit=4, after=cursor):
        got += [r.id for r in page]
        cursor = ListCursor(page[-1].created_at, page[-1].id)
    assert got == expected


# -- history_list ---------------------------------------------------------------------


async def _execution_with_seven_events(store: Store, clock: ManualClock) -> uuid.UUID:
    new = new_execution()
    await store.execution_submit(new)
    for _ in range(3):
        clock.advance(1)
        (c,) = await store.execution_claim("w", [new.ffqn], limit=1, lease_ttl=TTL)
        claim = Claim(c.id, "w", c.lease_epoch)
        clock.advance(1)
        if c.lease_epoch < 3:
            assert (await store.execution_release_if_owned(claim, "again")).applied
        else:
            assert (await store.execution_complete_if_owned(claim, "done")).applied
    return new.id


async def test_history_list_in_seq_order(store: Store, clock: ManualClock) -> None:
    start = clock.now()
    execution_id = await _execution_with_seven_events(store, clock)
    events = await store.history_list(execution_id)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6, 7]
    assert [e.kind for e in events] == [
        "pending",
        "running",
        "pending",
        "running",
        "pending",
        "running",
        "completed",
    ]
    assert [e.at for e in events] == [start + timedelta(seconds=s) for s in range(7)]
    await assert_history_consistent(store, execution_id)


async def test_history_list_after_seq_and_limit(store: Store, clock: ManualClock) -> None:
    execution_id = await _execution_with_seven_events(store, clock)
    full = await store.history_list(execution_id)
    assert await store.history_list(execution_id, after_seq=2, limit=3) == full[2:5]
    assert await store.history_list(execution_id, after_seq=5) == full[5:]
    assert await store.history_list(execution_id, after_seq=7) == []
    assert await store.history_list(execution_id, limit=1) == full[:1]
    assert await store.history_list(execution_id, after_seq=0, limit=100) == full
    # paging by after_seq walks the whole history once
    walked = []
    after = 0
    while page := await store.history_list(execution_id, after_seq=after, limit=2):
        walked += page
        after = page[-1].seq
    assert walked == full


async def test_history_list_is_per_execution(store: Store) -> None:
    a = new_execution()
    b = new_execution()
    await store.execution_submit(a)
    await store.execution_submit(b)
    await store.execution_claim("w", [a.ffqn], limit=1, lease_ttl=TTL)  # claims one of them
    history_a = await store.history_list(a.id)
    history_b = await store.history_list(b.id)
    assert {e.execution_id for e in history_a} == {a.id}
    assert {e.execution_id for e in history_b} == {b.id}
    assert sorted([len(history_a), len(history_b)]) == [1, 2]
    assert await store.history_list(uuid.uuid4()) == []


# -- the production clock -------------------------------------------------------------


async def test_database_clock_drives_times_when_no_clock_is_injected(
    database_url: str,
) -> None:
    s = await open_store(database_url, pool_size=1)  # DatabaseClock: the database's now()
    try:
        before = datetime.now(UTC)
        ex = (await s.execution_submit(new_execution())).execution
        assert abs(ex.created_at - before) < timedelta(minutes=1)
        assert ex.scheduled_at == ex.created_at == ex.updated_at
        assert ex.created_at.utcoffset() == timedelta(0)

        (claimed,) = await s.execution_claim("w", [ex.ffqn], limit=1, lease_ttl=TTL)
        assert claimed.lease_expires_at is not None
        assert claimed.lease_expires_at - claimed.updated_at == TTL
        assert claimed.updated_at >= ex.updated_at

        done = await s.execution_complete_if_owned(Claim(ex.id, "w", claimed.lease_epoch), 1)
        assert done.applied
        await assert_history_consistent(s, ex.id)
    finally:
        await s.close()
