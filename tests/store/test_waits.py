"""Store conformance: ``execution_waits``, what the history and the children of many
executions say about their waits (for ``waiting_reason``, veracity.core.waiting), read in a
fixed number of statements. Runs unchanged against every backend."""

from __future__ import annotations

import uuid

from tests.store._support import ENGINE_TTL, claim_exactly, get, new_child, submit_unique
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, WaitRecord
from veracity.store import Store


async def test_no_ids_no_records(store: Store) -> None:
    assert await store.execution_waits([]) == {}


async def test_the_newest_wait_events_and_unfinished_children_by_join_set(
    store: Store, clock: ManualClock
) -> None:
    parent = await submit_unique(store)
    claim = await claim_exactly(store, parent.id)
    kids = {js: [new_child(parent.id, join_set=js) for _ in range(n)]
            for js, n in (("js0", 3), ("js1", 1))}
    for js in ("js0", "js1"):
        for kid in kids[js]:
            clock.advance(1)
            spawned = await store.execution_spawn_if_owned(claim, [kid], [])
            assert spawned.applied
    # a child that ended is not waited for
    (done,) = await store.execution_claim("w-kid", [kids["js0"][0].ffqn], limit=1,
                                          lease_ttl=ENGINE_TTL)
    ended = await store.execution_complete_if_owned(
        Claim(done.id, "w-kid", done.lease_epoch), 1)
    assert ended.applied
    seen = (await get(store, parent.id)).signal_seq
    first = await store.execution_block_if_owned(
        claim, wake_at=None, seen_signal=seen, events=[], reason="first wait")
    assert first.applied and first.execution is not None
    assert first.execution.status == Status.BLOCKED
    paused = await store.execution_pause(parent.id, actor="ada")
    assert paused.changed

    other = await submit_unique(store, paused=True)
    unknown = uuid.uuid4()
    got = await store.execution_waits([parent.id, other.id, unknown, parent.id],
                                      shown_children=1)
    assert set(got) == {parent.id, other.id, unknown}
    assert got[unknown] == WaitRecord()
    mine = got[parent.id]
    assert mine.events["blocked"]["reason"] == "first wait"
    assert mine.events["paused"] == {"by": "ada", "from": "blocked"}
    assert "pause_requested" not in mine.events
    # js0: two left of three (the oldest unfinished one shown), js1: one
    assert mine.children == {"js0": (2, [kids["js0"][1].id]), "js1": (1, [kids["js1"][0].id])}
    assert set(got[other.id].events) == {"paused"}  # the submission's own event
    assert got[other.id].events["paused"]["ffqn"] == other.ffqn
    assert got[other.id].children == {}

    every = await store.execution_waits([parent.id], shown_children=5)
    assert every[parent.id].children["js0"] == (2, [k.id for k in kids["js0"][1:]])



async def test_who_paused_and_why_are_in_the_pause_events(store: Store) -> None:
    """``execution_pause(actor=, reason=)``: a pending one's ``paused`` event, a running
    one's ``pause_requested`` event; without a reason, none is recorded."""
    pending = await submit_unique(store)
    assert (await store.execution_pause(pending.id, actor="ada", reason="deploy freeze")
            ).changed
    running = await submit_unique(store)
    await claim_exactly(store, running.id)
    assert (await store.execution_pause(running.id, actor="bob", reason="look first")).changed
    plain = await submit_unique(store)
    assert (await store.execution_pause(plain.id, actor="cy")).changed
    got = await store.execution_waits([pending.id, running.id, plain.id])
    assert got[pending.id].events["paused"] == {
        "by": "ada", "from": "pending", "reason": "deploy freeze"}
    assert got[running.id].events["pause_requested"] == {"by": "bob", "reason": "look first"}
    assert "paused" not in got[running.id].events
    assert got[plain.id].events["paused"] == {"by": "cy", "from": "pending"}
