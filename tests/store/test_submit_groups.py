"""Group commit of single submissions (veracity/grouping.py) on every backend.

Submissions that arrive while a write is under way are written together, in one
transaction, and each is answered as ``execution_submit`` answers it, only once that
transaction has committed. Real stores, real databases; the faults are real triggers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import uuid
from collections.abc import Sequence

import psycopg
import pytest

from tests._helpers import pg_store_fixture
from tests.store._support import DB_ERRORS, RawSQL, assert_history_consistent, new_execution
from veracity.grouping import SubmitGroups, unavailable
from veracity.models import ExecutionFilter, NewExecution, Submitted
from veracity.store import Store

pg_store = pg_store_fixture()


async def _all_ids(store: Store) -> set[uuid.UUID]:
    return {e.id for e in await store.execution_list(ExecutionFilter(), limit=10_000)}


async def _together(groups: SubmitGroups, news: list[NewExecution]) -> list[Submitted]:
    """Submit all at once, as concurrent requests do."""
    return await asyncio.gather(*(groups.submit(n) for n in news))


async def test_a_lone_submission_is_written_alone(store: Store) -> None:
    groups = SubmitGroups(store)
    new = new_execution("app.one", [1], idempotency_key="k", request_digest="d")
    answer = await groups.submit(new)
    assert answer.created and answer.request_digest == "d"
    assert answer.execution == await store.execution_get(new.id)
    assert groups.groups == 0
    again = await groups.submit(dataclasses.replace(new, id=uuid.uuid4()))
    assert (again.created, again.execution.id) == (False, new.id)


class _Watched:
    """The store, noting which task runs each single write."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.writers: list[asyncio.Task[object] | None] = []

    async def execution_submit(self, new: NewExecution) -> Submitted:
        self.writers.append(asyncio.current_task())
        return await self.store.execution_submit(new)

    async def execution_submit_many(self, items: Sequence[NewExecution], *,
                                    all_or_nothing: bool = True) -> list[Submitted]:
        return await self.store.execution_submit_many(items, all_or_nothing=all_or_nothing)


async def test_a_lone_submission_is_written_by_its_caller(store: Store) -> None:
    watched = _Watched(store)
    groups = SubmitGroups(watched)
    caller = asyncio.create_task(groups.submit(new_execution("app.own", [1])))
    assert (await caller).created
    # no hand-off to a task of the groups' own: the caller's task ran the statement
    assert watched.writers == [caller]


async def test_a_lone_caller_that_gives_up_leaves_the_others_written(store: Store) -> None:
    groups = SubmitGroups(store)
    lone, *later = [new_execution("app.g", [i]) for i in range(4)]
    first = asyncio.create_task(groups.submit(lone))
    await asyncio.sleep(0)  # its write is under way, in its own task
    others = [asyncio.create_task(groups.submit(n)) for n in later]
    await asyncio.sleep(0)  # they wait for it
    first.cancel()
    answers = await asyncio.gather(*others)
    with pytest.raises(asyncio.CancelledError):
        await first
    # its own write went with it or not (cut off as any statement); the ones that waited
    # for it were written, together, once it was gone
    assert all(a.created for a in answers)
    assert {n.id for n in later} <= await _all_ids(store)
    assert groups.groups == 1


async def test_submissions_that_arrive_during_a_write_share_one_transaction(
    store: Store, raw: RawSQL
) -> None:
    sizes: list[int] = []
    groups = SubmitGroups(store, written=sizes.append)
    news = [new_execution("app.many", [i]) for i in range(20)]
    answers = await _together(groups, news)

    # the first found nothing being written and went alone; the 19 that came meanwhile,
    # together
    assert groups.groups == 1 and sizes == [1, 19]
    assert [a.execution.id for a in answers] == [n.id for n in news]
    assert all(a.created for a in answers)
    assert await _all_ids(store) == {n.id for n in news}
    for answer in answers:  # answered what is stored, with its first event
        assert await store.execution_get(answer.execution.id) == answer.execution
        (event,) = await assert_history_consistent(store, answer.execution.id)
        assert event.kind == "pending" and event.data["params"] == answer.execution.params
    if raw.backend == "postgresql":  # one transaction wrote the 19 (and one the first)
        assert raw.scalar("SELECT count(DISTINCT xmin::text) FROM veracity_executions") == 2


async def test_a_key_repeated_in_a_group_answers_each_caller_as_alone(store: Store) -> None:
    groups = SubmitGroups(store)
    first = new_execution(idempotency_key="other", request_digest="o")
    same = [new_execution("app.k", [1], idempotency_key="k", request_digest="d")
            for _ in range(4)]
    different = new_execution("app.k", [2], idempotency_key="k", request_digest="e")
    answers = await _together(groups, [first, *same, different])

    assert (groups.groups, groups.regrouped) == (1, 0)
    keyed = answers[1:5]
    assert [a.created for a in keyed] == [True, False, False, False]
    assert {a.execution.id for a in keyed} == {same[0].id}
    # the one with another request under the key hears the key's digest (a conflict for
    # its caller, as in veracity/control.py), and refused nothing of the others
    assert answers[5].execution.id == same[0].id and answers[5].request_digest == "d"
    assert not answers[5].created
    assert await _all_ids(store) == {first.id, same[0].id}


async def test_a_key_stored_before_answers_its_execution_in_a_group(store: Store) -> None:
    stored = (await store.execution_submit(
        new_execution(idempotency_key="k", request_digest="d"))).execution
    groups = SubmitGroups(store)
    news = [new_execution(), new_execution(idempotency_key="k", request_digest="d"),
            new_execution(idempotency_key="k", request_digest="x"), new_execution()]
    answers = await _together(groups, news)
    assert (groups.groups, groups.regrouped) == (1, 0)
    assert [a.created for a in answers] == [True, False, False, True]
    assert answers[1].execution == stored and answers[2].execution == stored
    assert [answers[1].request_digest, answers[2].request_digest] == ["d", "d"]
    assert await _all_ids(store) == {stored.id, news[0].id, news[3].id}


def _refuse_ffqn(raw: RawSQL, ffqn: str) -> None:
    """From now on the database refuses the first event of executions of ``ffqn``."""
    if raw.backend == "postgresql":
        raw.execute(
            "CREATE FUNCTION veracity_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN IF NEW.data->>'ffqn' = '" + ffqn + "' THEN RAISE EXCEPTION 'refused'; "
            "END IF; RETURN NEW; END $$")
        raw.execute("CREATE TRIGGER veracity_test_refuse BEFORE INSERT ON veracity_history "
                    "FOR EACH ROW EXECUTE FUNCTION veracity_test_refuse()")
    else:
        raw.execute(
            "CREATE TRIGGER veracity_test_refuse BEFORE INSERT ON veracity_history "
            "WHEN json_extract(NEW.data, '$.ffqn') = '" + ffqn + "' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END")


async def test_a_submission_the_database_refuses_fails_alone(
    store: Store, raw: RawSQL
) -> None:
    _refuse_ffqn(raw, "app.poison")
    groups = SubmitGroups(store)
    news = [new_execution("app.fine", [i]) for i in range(4)]
    news.insert(2, new_execution("app.poison", []))
    answers = await asyncio.gather(*(groups.submit(n) for n in news), return_exceptions=True)

    # the group (all but the first) was refused whole, then written one at a time: only
    # the refused submission's caller hears the error
    assert (groups.groups, groups.regrouped) == (1, 1)
    assert isinstance(answers[2], DB_ERRORS) and "refused" in str(answers[2])
    fine = [a for i, a in enumerate(answers) if i != 2]
    assert all(isinstance(a, Submitted) and a.created for a in fine)
    assert await _all_ids(store) == {n.id for i, n in enumerate(news) if i != 2}


async def test_a_group_that_fails_whole_writes_nothing_and_later_ones_go_on(
    store: Store, raw: RawSQL
) -> None:
    groups = SubmitGroups(store)
    news = [new_execution("app.f", [i]) for i in range(6)]
    with raw.history_insert_fails():
        answers = await asyncio.gather(*(groups.submit(n) for n in news),
                                       return_exceptions=True)
    assert all(isinstance(a, DB_ERRORS) and "boom" in str(a) for a in answers), answers
    assert await _all_ids(store) == set()
    later = [new_execution("app.f", [i]) for i in range(6)]
    assert all(a.created for a in await _together(groups, later))
    assert await _all_ids(store) == {n.id for n in later}


async def test_a_group_that_finds_the_database_unavailable_is_not_retried_one_by_one(
    pg_store: Store, pg_url: str
) -> None:
    # PostgreSQL only: SQLite says "unavailable" only after its busy timeout (30 s)
    store, raw = pg_store, RawSQL(pg_url)
    # the statement is cancelled (SQLSTATE 57014), as a statement timeout or an
    # administrator would: an OperationalError on a connection that stays usable
    raw.execute("CREATE FUNCTION veracity_test_cancel() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'cancelled' USING ERRCODE = '57014'; END $$")
    raw.execute("CREATE TRIGGER veracity_test_cancel BEFORE INSERT ON veracity_history "
                "FOR EACH ROW EXECUTE FUNCTION veracity_test_cancel()")
    groups = SubmitGroups(store)
    answers = await asyncio.gather(*(groups.submit(new_execution()) for _ in range(6)),
                                   return_exceptions=True)
    assert all(isinstance(a, psycopg.OperationalError) for a in answers), answers
    # every caller of the group heard it from the one write: no write of its own each
    assert (groups.groups, groups.regrouped) == (1, 0)
    assert await _all_ids(store) == set()


async def test_a_caller_that_gives_up_does_not_stop_the_write(store: Store) -> None:
    groups = SubmitGroups(store)
    news = [new_execution("app.c", [i]) for i in range(5)]
    tasks = [asyncio.create_task(groups.submit(n)) for n in news]
    await asyncio.sleep(0)  # every one is waiting: the first being written, the rest queued
    tasks[3].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[3], asyncio.CancelledError)
    assert all(isinstance(a, Submitted) and a.created for i, a in enumerate(done) if i != 3)
    # it was in the group when its caller left: written all the same (as a request cut off
    # after its statement was sent), and the others were answered
    assert await _all_ids(store) == {n.id for n in news}


async def test_a_group_carries_at_most_its_limit(store: Store, raw: RawSQL) -> None:
    sizes: list[int] = []
    groups = SubmitGroups(store, limit=3, written=sizes.append)
    news = [new_execution("app.l", [i]) for i in range(10)]
    answers = await _together(groups, news)
    assert groups.groups == 3 and sizes == [1, 3, 3, 3]
    assert [a.execution.id for a in answers] == [n.id for n in news]
    if raw.backend == "postgresql":
        assert raw.scalar("SELECT count(DISTINCT xmin::text) FROM veracity_executions") == 4


async def test_two_writers_start_two_writes_before_grouping(store: Store) -> None:
    groups = SubmitGroups(store, writers=2)
    news = [new_execution("app.w", [i]) for i in range(10)]
    answers = await _together(groups, news)
    # the first two went alone at once; the 8 that came meanwhile, together
    assert groups.groups == 1
    assert all(a.created for a in answers)
    assert await _all_ids(store) == {n.id for n in news}


async def test_children_are_written_alone(store: Store) -> None:
    parent = (await store.execution_submit(new_execution())).execution
    groups = SubmitGroups(store)
    children = [dataclasses.replace(new_execution("app.child"), parent_id=parent.id,
                                    join_set="js") for _ in range(4)]
    answers = await _together(groups, children)
    assert groups.groups == 0
    assert all(a.created and a.execution.parent_id == parent.id for a in answers)


def test_what_counts_as_the_database_unavailable() -> None:
    import psycopg_pool

    assert unavailable(sqlite3.OperationalError("database is locked"))
    assert unavailable(psycopg.OperationalError("connection refused"))
    assert unavailable(psycopg_pool.PoolTimeout("no connection"))
    assert not unavailable(sqlite3.IntegrityError("refused"))
    assert not unavailable(psycopg.errors.RaiseException("refused"))
    assert not unavailable(ValueError("bad"))


@pytest.mark.parametrize("kwargs", [{"writers": 0}, {"limit": 0}, {"writers": -1}])
def test_bad_sizes_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SubmitGroups(object(), **kwargs)  # type: ignore[arg-type]
