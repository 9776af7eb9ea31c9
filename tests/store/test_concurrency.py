"""Store conformance under concurrency: several store instances on one database (as
several processes would have) race to migrate, to submit with one idempotency key, and to
claim. Runs unchanged against every backend."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta

import pytest

from tests.store._support import RawSQL, StoreFactory, new_execution
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, ExecutionFilter
from veracity.store import Store
from veracity.store._sql import load_migrations

TTL = timedelta(seconds=60)
FFQN = "app.batch.item"


async def test_concurrent_migrate_on_an_empty_database(
    empty_database_url: str, open_extra_store: StoreFactory, backend: str
) -> None:
    package = "veracity.store.postgres" if backend == "postgresql" else "veracity.store.sqlite"
    versions = [m.version for m in load_migrations(package)]
    stores = [await open_extra_store(empty_database_url, pool_size=1) for _ in range(4)]
    applied = await asyncio.gather(*(s.migrate() for s in stores))

    # every version applied by exactly one of them; the others applied nothing
    assert sorted(v for a in applied for v in a) == versions
    assert sum(1 for a in applied if a) == 1
    assert RawSQL(empty_database_url).migration_versions() == versions
    for s in stores:
        await s.ping()
        assert await s.migrate() == []
    sub = await stores[-1].execution_submit(new_execution())
    assert sub.created


async def test_store_opens_while_another_connection_is_writing_a_fresh_database(
    empty_database_url: str, open_extra_store: StoreFactory
) -> None:
    """Several processes starting at once on a new database: one may be writing (setting
    up or migrating) while another opens. Opening waits for it; it does not fail."""
    raw = RawSQL(empty_database_url)
    with raw.writer_holding_a_transaction():
        opening = asyncio.ensure_future(open_extra_store(empty_database_url, pool_size=1))
        # the only wait in the suite: long enough to see an open fail instead of waiting
        await asyncio.wait({opening}, timeout=0.5)
        if opening.done():
            opening.result()  # raises if the open failed while the other was writing
    s = await opening
    assert await s.migrate() != []
    await s.ping()
    assert (await s.execution_submit(new_execution())).created


@pytest.mark.parametrize("racers", [2, 10])
async def test_concurrent_submissions_with_one_key_create_one_execution(
    store: Store, open_extra_store: StoreFactory, racers: int
) -> None:
    stores = [await open_extra_store() for _ in range(racers)]
    news = [
        new_execution(FFQN, [i], idempotency_key="same-key", request_digest=f"digest-{i}")
        for i in range(racers)
    ]
    results = await asyncio.gather(
        *(s.execution_submit(n) for s, n in zip(stores, news, strict=True))
    )

    created = [r for r in results if r.created]
    assert len(created) == 1
    winner = created[0].execution
    winner_index = next(i for i, n in enumerate(news) if n.id == winner.id)
    assert all(r.execution.id == winner.id for r in results)
    assert all(r.request_digest == f"digest-{winner_index}" for r in results)
    rows = await store.execution_list(ExecutionFilter(), limit=100)
    assert [r.id for r in rows] == [winner.id]
    assert len(await store.history_list(winner.id)) == 1
    for n in news:
        if n.id != winner.id:
            assert await store.execution_get(n.id) is None


async def test_concurrent_claimers_never_share_an_execution(
    store: Store, open_extra_store: StoreFactory, clock: ManualClock
) -> None:
    total = 200
    ids = set()
    for i in range(total):
        new = new_execution(FFQN, [i], scheduled_at=clock.now() - timedelta(seconds=i % 7))
        await store.execution_submit(new)
        ids.add(new.id)
    claimers = [await open_extra_store() for _ in range(8)]

    async def claim_until_empty(s: Store, owner: str) -> list[uuid.UUID]:
        got: list[uuid.UUID] = []
        while batch := await s.execution_claim(owner, [FFQN], limit=10, lease_ttl=TTL):
            assert len(batch) <= 10
            assert all(e.status == Status.RUNNING and e.lease_owner == owner for e in batch)
            got += [e.id for e in batch]
        return got

    owners = [f"worker-{i}" for i in range(len(claimers))]
    per_owner = await asyncio.gather(
        *(claim_until_empty(s, o) for s, o in zip(claimers, owners, strict=True))
    )

    claimed = Counter(i for got in per_owner for i in got)
    assert set(claimed) == ids  # every execution claimed ...
    assert max(claimed.values()) == 1  # ... and none twice
    assert await store.execution_claim("late", [FFQN], limit=10, lease_ttl=TTL) == []

    owner_of = {i: o for o, got in zip(owners, per_owner, strict=True) for i in got}
    rows = await store.execution_list(ExecutionFilter(), limit=total + 1)
    assert len(rows) == total
    for row in rows:
        assert row.status == Status.RUNNING
        assert row.lease_epoch == 1
        assert row.lease_owner == owner_of[row.id]
        assert row.lease_expires_at == clock.now() + TTL
    for execution_id in list(ids)[:20]:
        history = await store.history_list(execution_id)
        assert [(e.seq, e.kind) for e in history] == [(1, "pending"), (2, "running")]
        assert history[1].data["owner"] == owner_of[execution_id]


async def test_concurrent_reports_on_one_lease_apply_once(
    store: Store, open_extra_store: StoreFactory
) -> None:
    """Several instances report for the same lease at once (a duplicated completion
    message): one completion applies, every other report is refused and kept."""
    new = new_execution(FFQN)
    await store.execution_submit(new)
    (c,) = await store.execution_claim("worker-a", [FFQN], limit=1, lease_ttl=TTL)
    claim = Claim(c.id, "worker-a", c.lease_epoch)
    stores = [await open_extra_store() for _ in range(6)]
    results = await asyncio.gather(
        *(s.execution_complete_if_owned(claim, {"by": i}) for i, s in enumerate(stores))
    )
    applied = [r for r in results if r.applied]
    assert len(applied) == 1
    got = await store.execution_get(new.id)
    assert got is not None and got.status == Status.COMPLETED
    assert applied[0].execution is not None
    assert got.result == applied[0].execution.result
    history = await store.history_list(new.id)
    assert [e.seq for e in history] == list(range(1, len(history) + 1))
    assert Counter(e.kind for e in history) == Counter(
        {"pending": 1, "running": 1, "completed": 1, "late_report": 5}
    )
