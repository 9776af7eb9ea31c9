"""``veracity.testing.replay``: a recorded history replayed against an app's current code,
from the history alone (docs/workflows.md, "Checking a code change against production
histories").

The histories are real: ``tests.testing.replay_apps:app`` runs an order with a worker
in-process on both backends (a step, now, a durable sleep, a child, a schedule, a receive,
a step). Each history is then replayed, after the store is closed, against the same code,
against changed code (a renamed step, other step arguments, a removed call, an added call),
from prefixes of it (what the history looked like while the execution waited), and from
the API's JSON items. Bad input gets a clear error.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.durable._support import (
    DEPLOYMENT,
    history,
    make_worker,
    running,
    submit,
    wait_kind,
    wait_status,
)
from tests.testing import replay_apps as ra
from veracity import App
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.errors import InvalidInput
from veracity.models import Claim, HistoryEvent, NewExecution
from veracity.store import Store, open_store
from veracity.testing import ReplayResult, replay, replay_async
from veracity.worker.journal import step_name

CHARGE = f"step {step_name(ra.charge)}"
SHIP = f"step {step_name(ra.ship)}"


@dataclass
class Recorded:
    execution_id: uuid.UUID
    events: list[HistoryEvent]
    api_page: dict[str, Any]
    """``GET /v1/executions/{id}/history``'s JSON body."""
    child_events: list[HistoryEvent]
    marks: Path


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await open_store(database_url, pool_size=4)
    try:
        yield opened
    finally:
        await opened.close()


async def run_order(database_url: str, tmp_path: Path) -> Recorded:
    """Run one order to its end with a worker, answering its receive; return its history
    (as the store and as the API give it) and its child's. The store is closed after: the
    replays have nothing but the recorded events."""
    store = await open_store(database_url, pool_size=4)
    try:
        return await _run_order(store, tmp_path)
    finally:
        await store.close()


async def _run_order(store: Store, tmp_path: Path) -> Recorded:
    marks = tmp_path / "marks"
    service = ExecutionService(store, workflows=set(ra.app.workflows),
                               deployment_id=DEPLOYMENT)
    worker = make_worker(store, ra.app)
    async with running(worker):
        ex = await submit(store, ra.PROCESS, str(marks), "o-1")
        await wait_kind(store, ex.id, "recv_started")
        await service.send(ex.id, "approval", {"by": "ada"})
        done = await wait_status(store, ex.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    events = await history(store, ex.id)
    submitted = [e for e in events if e.kind == "child_submitted"]
    child_events = await history(store, uuid.UUID(submitted[0].data["child_id"]))
    transport = httpx.ASGITransport(app=create_api(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get(f"/v1/executions/{ex.id}/history")
    assert response.status_code == 200, response.text
    return Recorded(ex.id, events, response.json(), child_events, marks)


def cut_after(events: list[HistoryEvent], kind: str, nth: int = 1) -> list[HistoryEvent]:
    """The history as it was when its ``nth`` event of ``kind`` had just been written."""
    seen = 0
    for i, ev in enumerate(events):
        if ev.kind == kind:
            seen += 1
            if seen == nth:
                return events[: i + 1]
    raise AssertionError(f"no {kind} #{nth} in {[e.kind for e in events]}")


async def test_replays_of_a_real_history(database_url: str, tmp_path: Path) -> None:
    rec = await run_order(database_url, tmp_path)
    assert [e.data.get("pos") for e in rec.events if "pos" in e.data] == [
        0, 1, 2, 3, 4, 5, 6, 6, 7]  # recv_started and message_received share position 6
    marks_before = rec.marks.read_text()
    assert marks_before.splitlines() == ["charge", "ship"]

    # the same code: consistent to its end, with every recorded call made once again
    same = await replay_async(ra.app, rec.events)
    assert same == ReplayResult(
        rec.execution_id, ra.PROCESS, True, None,
        "consistent: the workflow ran to its end (it returned) making exactly the 8 calls "
        "its history records", replayed=8, finished=True)

    # a renamed step, other step arguments: the first divergence, naming both calls
    renamed = await replay_async(ra.renamed, rec.events)
    assert (renamed.consistent, renamed.position, renamed.replayed) == (False, 0, 0)
    assert renamed.recorded == CHARGE and renamed.new == f"step {step_name(ra.bill)}"
    assert renamed.message == (f"nondeterminism at position 0: the history has {CHARGE}, "
                               f"but the workflow now calls step {step_name(ra.bill)}")
    other = await replay_async(ra.other_args, rec.events)
    assert (other.consistent, other.position) == (False, 0)
    assert other.message.startswith(f"nondeterminism at position 0: the history has "
                                    f"{CHARGE} with arguments ")
    assert f"{CHARGE} with other arguments" in other.message

    # a removed call: the workflow finishes with a recorded call it never made
    removed = await replay_async(ra.removed, rec.events)
    assert (removed.consistent, removed.position, removed.finished) == (False, 7, True)
    assert removed.message == ("the workflow finished but its history holds calls this "
                               f"code never made: {SHIP} at position 7")
    assert removed.replayed == 7

    # an added call at the end: consistent as far as the history goes, the rest is new
    added = await replay_async(ra.added, rec.events)
    assert (added.consistent, added.position, added.finished) == (True, 8, False)
    assert added.replayed == 8 and added.new == f"step {step_name(ra.notify)}"
    assert added.message == (
        "consistent so far: replayed 8 recorded calls; the history ends there: the "
        f"workflow's next call, step {step_name(ra.notify)} at position 8, and what "
        "follows are new")

    # no step ran in any replay
    assert rec.marks.read_text() == marks_before


async def test_replays_of_a_history_the_execution_was_still_writing(
    database_url: str, tmp_path: Path
) -> None:
    """Prefixes of a real history are what it looked like while the execution ran: the
    replay stops where the history ends, at a wait or at a call not recorded yet."""
    rec = await run_order(database_url, tmp_path)
    expectations = [
        # (the history up to, position, calls replayed, waiting, the call at position)
        (cut_after(rec.events, "pending"), 0, 0, False, CHARGE),
        (cut_after(rec.events, "blocked", 1), 2, 3, True, "sleep(1s)"),
        (cut_after(rec.events, "running", 2), 3, 3, False, f"submit {ra.SEND}(\"o-1\")"),
        (cut_after(rec.events, "child_submitted"), 4, 4, False, "next() of join set js0"),
        (cut_after(rec.events, "join_next"), 5, 5, False, f"schedule {ra.AUDIT}(\"o-1\")"),
        (cut_after(rec.events, "recv_started"), 6, 7, True, "recv('approval')"),
        (cut_after(rec.events, "message_arrived"), 6, 7, True, "recv('approval')"),
        (cut_after(rec.events, "message_received"), 7, 7, False, SHIP),
    ]
    for events, position, replayed, waiting, call in expectations:
        got = await replay_async(ra.app, events)
        where = (events[-1].seq, events[-1].kind)
        assert got.consistent and not got.finished, (where, got)
        assert (got.position, got.replayed, got.waiting, got.new) == (
            position, replayed, waiting, call), (where, got)
        if waiting:
            assert got.message == (
                f"consistent so far: replayed {replayed} recorded calls; the history ends "
                f"while the execution waits in {call} at position {position} (recorded, "
                "not over yet): what follows is new"), where
    # up to its last call, before its completion was written: the run reaches its end
    done = await replay_async(ra.app, cut_after(rec.events, "step_completed", 2))
    assert done.consistent and done.finished and done.replayed == 8

    # a divergence shows in a prefix too, and a removed call is not "left over" in a
    # history that ends before it
    assert not (await replay_async(ra.renamed, rec.events[:3])).consistent
    early = await replay_async(ra.removed, cut_after(rec.events, "message_received"))
    assert early.consistent and early.finished  # returns where the history ends
    assert rec.marks.read_text().splitlines() == ["charge", "ship"]


async def test_the_apis_json_items_replay_like_the_events(database_url: str, tmp_path: Path
                                                         ) -> None:
    rec = await run_order(database_url, tmp_path)
    page = rec.api_page
    assert page["next_cursor"] is None and len(page["items"]) == len(rec.events)
    expected = await replay_async(ra.removed, rec.events)
    assert not expected.consistent
    for given in (page, page["items"]):
        for ident in (rec.execution_id, str(rec.execution_id)):
            got = await replay_async(ra.removed, given, execution_id=ident)
            assert got == expected
    assert (await replay_async(ra.app, page, execution_id=rec.execution_id)).consistent
    # the items do not name their execution: without its id, a clear error
    with pytest.raises(InvalidInput, match=r"execution_id="):
        await replay_async(ra.app, page["items"])
    # a page that is not the whole history
    with pytest.raises(InvalidInput, match="next_cursor"):
        await replay_async(ra.app, {**page, "next_cursor": "abc"},
                           execution_id=rec.execution_id)
    # HistoryEvents of another execution than the one named
    with pytest.raises(InvalidInput, match="is of execution"):
        await replay_async(ra.app, rec.events, execution_id=uuid.uuid4())


async def test_replay_runs_from_async_and_sync_code(database_url: str, tmp_path: Path) -> None:
    rec = await run_order(database_url, tmp_path)
    # called in a running event loop (this test's): it replays on a thread of its own
    in_loop = replay(ra.added, rec.events)
    # called where no loop runs
    off_loop = await asyncio.to_thread(replay, ra.added, rec.events)
    assert in_loop == off_loop == await replay_async(ra.added, rec.events)
    assert in_loop.to_json() == {
        "execution_id": str(rec.execution_id), "ffqn": ra.PROCESS, "consistent": True,
        "position": 8, "message": in_loop.message, "replayed": 8, "finished": False,
        "recorded": None, "new": f"step {step_name(ra.notify)}", "waiting": False}


async def test_a_workflow_the_app_does_not_register_is_a_clear_error(
    database_url: str, tmp_path: Path
) -> None:
    rec = await run_order(database_url, tmp_path)
    assert (await replay_async(ra.app, rec.child_events)).consistent
    with pytest.raises(InvalidInput) as info:
        await replay_async(ra.renamed, rec.child_events)  # registers only the order
    assert info.value.code == "unknown_workflow"
    assert str(info.value) == (
        f"execution {rec.child_events[0].execution_id} runs workflow {ra.SEND!r}, which the "
        f"app does not register (it registers: {ra.PROCESS})")


async def test_a_run_delegated_to_an_external_engine_is_not_replayed(store: Store) -> None:
    # a real delegation, as the worker writes it before it triggers the engine
    new = NewExecution(ffqn="shop:n8n/fulfil.run", params=["o-9"], deployment_id=DEPLOYMENT,
                       id=uuid.uuid4())
    await store.execution_submit(new)
    (ex,) = await store.execution_claim("w-ext", [new.ffqn], limit=1,
                                        lease_ttl=timedelta(seconds=30))
    delegated = await store.execution_delegate_if_owned(
        Claim(ex.id, "w-ext", ex.lease_epoch), "n8n", hashlib.sha256(b"t").hexdigest())
    assert delegated.applied
    events = await history(store, ex.id)
    assert "trigger_sending" in [e.kind for e in events]
    both = App("both")

    @both.workflow("shop:n8n/fulfil.run")  # even an app with a workflow of that name
    async def fulfil(ctx: Any, order: str) -> str:
        return order

    for app in (both, ra.app):
        with pytest.raises(InvalidInput) as info:
            await replay_async(app, events)
        assert info.value.code == "not_replayable"
        assert "delegated to an external engine (n8n)" in str(info.value)
        assert "replay applies to Veracity's own workflows" in str(info.value)


# -- bad input, no database -----------------------------------------------------------------

EXECUTION = uuid.UUID("00000000-0000-7000-8000-0000000000b1")


def item(seq: int, kind: str, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "at": f"2030-01-01T00:00:{seq:02d}Z", "data": data}


SUBMITTED = item(1, "pending", ffqn=ra.PROCESS, params=["/nonexistent/marks", "o-1"])


@pytest.mark.parametrize(("history", "fragment"), [
    ([], "the history is empty"),
    ("[]", "a history is a list of events"),
    ({"events": []}, "a page with 'items'"),
    ([SUBMITTED, 3], "history item 1 is a int, not an event"),
    ([{"seq": 1, "kind": "pending"}], "history item 0 lacks at, data"),
    ([{**SUBMITTED, "seq": "1"}], "seq must be an integer"),
    ([{**SUBMITTED, "at": "yesterday"}], "ISO 8601 time with its timezone"),
    ([{**SUBMITTED, "at": "2030-01-01T00:00:00"}], "ISO 8601 time with its timezone"),
    ([item(2, "running")], "starts at seq 2: give it from its first event (seq 1)"),
    ([SUBMITTED, item(3, "running"), item(2, "running")],
     "not in order: seq 2 comes after seq 3"),
    ([SUBMITTED, {**item(2, "running"), "execution_id": str(uuid.uuid4())}],
     "is of execution"),
    ([item(1, "running")], "is not an execution's submission"),
    ([item(1, "pending", ffqn=ra.PROCESS)], "is not an execution's submission"),
    ([{**SUBMITTED, "execution_id": "nope"}], "'nope' is not an execution id"),
])
def test_a_malformed_history_is_refused_with_a_clear_error(history: Any, fragment: str
                                                           ) -> None:
    with pytest.raises(InvalidInput) as info:
        replay(ra.app, history, execution_id=EXECUTION)
    assert fragment in str(info.value)
    assert info.value.code in ("invalid_history", "invalid_id")


def test_a_well_formed_synthetic_history_replays() -> None:
    """The same checks let a history that is only submitted through: nothing recorded, the
    first call is new (and nothing runs: its marks file does not exist)."""
    got = replay(ra.app, [SUBMITTED], execution_id=EXECUTION)
    assert got.consistent and got.position == 0 and got.new == CHARGE
    assert not Path("/nonexistent/marks").exists()
