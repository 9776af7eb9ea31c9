"""The workflow context driven directly against a real store (both backends).

Each test submits an execution, claims it (30 s lease, :class:`ManualClock`), and calls
``ctx.step`` the way a workflow does: checkpoints, replay by memoization, retries,
determinism errors, fencing after a lost lease, and cooperative interruption.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import random
import re
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest

from tests._helpers import clocked_store_fixture, history
from veracity.clock import ManualClock
from veracity.core.retry import RetryPolicy
from veracity.core.states import Status
from veracity.models import Claim, Execution, HistoryEvent, NewExecution
from veracity.store import Store
from veracity.worker.context import (
    STEP_COMPLETED,
    STEP_FAILED,
    Context,
    ExecutionInterrupted,
    Journal,
    NondeterminismError,
    NotJSONError,
    StepFailed,
    step_name,
)

TTL = timedelta(seconds=30)
FFQN = "test:ctx/run.fn"
OWNER = "worker-ctx"
FAST = RetryPolicy(max_attempts=3, initial_delay=0)


store = clocked_store_fixture(pool_size=2)


async def submit(store: Store) -> Execution:
    new = NewExecution(ffqn=FFQN, params=[], deployment_id="dep-ctx", id=uuid.uuid4())
    return (await store.execution_submit(new)).execution


async def claim(store: Store, owner: str = OWNER) -> tuple[Execution, Claim]:
    (ex,) = await store.execution_claim(owner, [FFQN], limit=1, lease_ttl=TTL)
    return ex, Claim(ex.id, owner, ex.lease_epoch)


def make_ctx(
    store: Store, ex: Execution, c: Claim, journal: Journal | None = None
) -> Context:
    return Context(
        store=store,
        claim=c,
        execution_id=ex.id,
        deployment_id=ex.deployment_id,
        attempt=ex.attempt,
        journal=journal,
        rng=random.Random(7),
    )


@pytest.fixture
async def ctx(store: Store) -> Context:
    await submit(store)
    ex, c = await claim(store)
    return make_ctx(store, ex, c)


async def journal_events(store: Store, execution_id: uuid.UUID) -> list[HistoryEvent]:
    return [e for e in await history(store, execution_id)
            if e.kind in (STEP_COMPLETED, STEP_FAILED)]


async def replay_ctx(store: Store, old: Context) -> Context:
    """What a worker does after a crash: the execution comes back (released here), is
    claimed again with a new epoch, and a new context replays its history."""
    got = await store.execution_get(old.execution_id)
    assert got is not None and got.lease_owner is not None
    rel = await store.execution_release_if_owned(
        Claim(got.id, got.lease_owner, got.lease_epoch), "test: run again"
    )
    assert rel.applied
    ex, c = await claim(store, "worker-replay")
    assert ex.id == old.execution_id
    return make_ctx(store, ex, c, Journal.from_history(await history(store, ex.id)))


class Counter:
    """Step functions that count their calls (sync and async)."""

    def __init__(self) -> None:
        self.calls = 0

    def sync_value(self, value: Any) -> Any:
        self.calls += 1
        return value

    async def async_value(self, value: Any) -> Any:
        self.calls += 1
        await asyncio.sleep(0)
        return value


class Boom(Exception):
    pass


class Fatal(Exception):
    pass


# -- checkpoints ------------------------------------------------------------------------


async def test_step_result_is_checkpointed_and_returned(store: Store, ctx: Context) -> None:
    counter = Counter()
    got = await ctx.step(counter.async_value, {"order": 42, "items": ["a", "b"]})
    assert got == {"order": 42, "items": ["a", "b"]}
    assert counter.calls == 1
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.kind == STEP_COMPLETED
    assert ev.data["pos"] == 0
    assert ev.data["name"] == step_name(counter.async_value)
    assert ev.data["name"].endswith("Counter.async_value")
    assert ev.data["result"] == {"order": 42, "items": ["a", "b"]}
    assert ev.data["attempts"] == 1
    assert ctx.steps_run == 1
    # the status does not change with a checkpoint
    ex = await store.execution_get(ctx.execution_id)
    assert ex is not None and ex.status == Status.RUNNING


async def test_positions_count_up_step_by_step(store: Store, ctx: Context) -> None:
    counter = Counter()
    for i in range(4):
        assert await ctx.step(counter.sync_value, i * 10) == i * 10
    events = await journal_events(store, ctx.execution_id)
    assert [(e.data["pos"], e.data["result"]) for e in events] == [
        (0, 0), (1, 10), (2, 20), (3, 30)
    ]
    seqs = [e.seq for e in await history(store, ctx.execution_id)]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_result_is_returned_as_its_json_form(store: Store, ctx: Context) -> None:
    """The first run sees what a replay will see: a tuple comes back as a list, int keys
    as strings. Otherwise a workflow could branch differently on replay."""
    got = await ctx.step(Counter().sync_value, {"t": (1, 2), 3: "x"})
    assert got == {"t": [1, 2], "3": "x"}
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.data["result"] == got


async def test_sync_function_runs_in_a_thread(ctx: Context) -> None:
    def where() -> int:
        return threading.get_ident()

    async def where_async() -> int:
        return threading.get_ident()

    loop_thread = threading.get_ident()
    assert await ctx.step(where) != loop_thread
    assert await ctx.step(where_async) == loop_thread


async def test_sync_function_does_not_block_the_event_loop(ctx: Context) -> None:
    release = threading.Event()
    ticks = 0

    def blocking() -> str:
        assert release.wait(5)
        return "done"

    async def ticker() -> None:
        nonlocal ticks
        while not release.is_set():
            ticks += 1
            if ticks >= 3:
                release.set()
            await asyncio.sleep(0.005)

    results = await asyncio.gather(ctx.step(blocking), ticker())
    assert results[0] == "done"
    assert ticks >= 3


async def test_args_and_kwargs_are_passed(store: Store, ctx: Context) -> None:
    def sync_fn(a: int, b: str, *, c: bool, d: list[int]) -> list[Any]:
        return [a, b, c, d]

    async def async_fn(a: int, *, b: int = 0) -> int:
        return a + b

    assert await ctx.step(sync_fn, 1, "two", c=True, d=[4]) == [1, "two", True, [4]]
    assert await ctx.step(async_fn, 1, b=41) == 42
    assert await ctx.step_with(async_fn, 2, b=3, retry=FAST) == 5
    events = await journal_events(store, ctx.execution_id)
    assert [e.data["result"] for e in events] == [[1, "two", True, [4]], 42, 5]


async def test_step_with_records_the_chosen_name(store: Store, ctx: Context) -> None:
    assert await ctx.step_with(Counter().sync_value, "v", name="charge-card") == "v"
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.data["name"] == "charge-card"


async def test_none_result_is_checkpointed_and_replayed(store: Store, ctx: Context) -> None:
    counter = Counter()
    assert await ctx.step(counter.sync_value, None) is None
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.kind == STEP_COMPLETED and ev.data["result"] is None

    again = await replay_ctx(store, ctx)
    assert await again.step(counter.sync_value, None) is None
    assert counter.calls == 1


# -- replay -------------------------------------------------------------------------------


async def test_replay_returns_recorded_results_without_running(
    store: Store, ctx: Context
) -> None:
    counter = Counter()
    first = [
        await ctx.step(counter.sync_value, "a"),
        await ctx.step(counter.async_value, {"b": 2}),
    ]
    assert counter.calls == 2

    again = await replay_ctx(store, ctx)
    # the recorded results come back; the functions do not run again
    replayed = [
        await again.step(counter.sync_value, "a"),
        await again.step(counter.async_value, {"b": 2}),
    ]
    assert replayed == first
    assert counter.calls == 2
    assert again.steps_run == 0
    # past the recorded positions, steps run again (and are checkpointed by the new owner)
    assert await again.step(counter.sync_value, "c") == "c"
    assert counter.calls == 3
    assert again.steps_run == 1
    events = await journal_events(store, ctx.execution_id)
    assert [(e.data["pos"], e.data["result"]) for e in events] == [
        (0, "a"), (1, {"b": 2}), (2, "c")
    ]


async def test_replay_with_other_step_arguments_is_nondeterminism(
    store: Store, ctx: Context
) -> None:
    """A recorded result is only returned to the same call: same function, same (JSON)
    arguments. Other arguments at that position are a change of the workflow's code or of
    its inputs, and returning the old result would be a lie."""
    counter = Counter()
    await ctx.step(counter.sync_value, "a")
    again = await replay_ctx(store, ctx)
    with pytest.raises(NondeterminismError) as info:
        await again.step(counter.sync_value, "CHANGED")
    assert info.value.position == 0
    assert "with other arguments" in info.value.new
    assert again.nondeterminism is info.value
    assert counter.calls == 1


async def test_replay_of_a_recorded_failure_raises_the_same_error(
    store: Store, ctx: Context
) -> None:
    calls = 0

    def fails() -> None:
        nonlocal calls
        calls += 1
        raise Boom("card declined")

    with pytest.raises(StepFailed) as first:
        await ctx.step_with(fails, retry=RetryPolicy(max_attempts=1))
    assert calls == 1
    assert isinstance(first.value.__cause__, Boom)

    again = await replay_ctx(store, ctx)
    with pytest.raises(StepFailed) as second:
        await again.step_with(fails, retry=RetryPolicy(max_attempts=1))
    assert calls == 1  # not run again
    assert (second.value.step, second.value.error_type, second.value.error_message) == (
        first.value.step, first.value.error_type, first.value.error_message
    )
    assert second.value.error_type == "Boom"
    assert second.value.error_message == "card declined"
    assert str(second.value) == str(first.value)


async def test_workflow_that_catches_a_failed_step_replays_the_same_way(
    store: Store, ctx: Context
) -> None:
    """The point of raising the same StepFailed on replay: code that handles it takes the
    same branch, and the steps after it replay too."""
    counter = Counter()

    def fails() -> None:
        raise Boom("nope")

    async def workflow(c: Context) -> list[Any]:
        out: list[Any] = []
        try:
            await c.step_with(fails, retry=RetryPolicy(max_attempts=1))
        except StepFailed as exc:
            out.append(await c.step(counter.sync_value, f"compensate {exc.error_type}"))
        out.append(await c.step(counter.sync_value, "end"))
        return out

    first = await workflow(ctx)
    assert counter.calls == 2
    again = await replay_ctx(store, ctx)
    assert await workflow(again) == first == ["compensate Boom", "end"]
    assert counter.calls == 2


async def test_a_different_step_at_a_recorded_position_is_nondeterminism(
    store: Store, ctx: Context
) -> None:
    def reserve_stock() -> str:
        return "reserved"

    def charge_card() -> str:
        raise AssertionError("must not run")

    await ctx.step(reserve_stock)
    again = await replay_ctx(store, ctx)
    with pytest.raises(NondeterminismError) as err:
        await again.step(charge_card)
    e = err.value
    assert e.position == 0
    assert "reserve_stock" in e.recorded and "charge_card" in e.new
    assert step_name(reserve_stock) in str(e)
    assert step_name(charge_card) in str(e)
    assert "position 0" in str(e)


async def test_a_renamed_step_is_nondeterminism(store: Store, ctx: Context) -> None:
    await ctx.step_with(Counter().sync_value, 1, name="one")
    again = await replay_ctx(store, ctx)
    with pytest.raises(NondeterminismError, match="one"):
        await again.step_with(Counter().sync_value, 1, name="two")


class Charge:
    """A callable object used as a step (a client with ``__call__``, say)."""

    def __init__(self, calls: list[int]) -> None:
        self.calls = calls

    def __call__(self, amount: int) -> int:
        self.calls.append(amount)
        return amount


def _add(a: int, b: int) -> int:
    return a + b


@pytest.mark.parametrize(
    "make",
    [
        lambda: functools.partial(_add, 1),
        lambda: Charge([]),
    ],
    ids=["partial", "callable_object"],
)
def test_step_names_carry_no_memory_address(make: Any) -> None:
    """A step's name is recorded and compared on replay, in another process after a
    crash: it must not contain ``0x7f...`` addresses, which differ from run to run."""
    name = step_name(make())
    assert re.search(r"0x[0-9a-fA-F]{6,}", name) is None, name
    assert step_name(make()) == name


async def test_a_callable_object_step_replays(store: Store, ctx: Context) -> None:
    """The workflow builds its client anew on every run (as after a crash)."""
    calls: list[int] = []
    assert await ctx.step(Charge(calls), 5) == 5
    again = await replay_ctx(store, ctx)
    assert await again.step(Charge(calls), 5) == 5
    assert calls == [5]


def test_journal_from_history_keeps_journal_events_by_position() -> None:
    from datetime import UTC, datetime

    eid = uuid.uuid4()
    at = datetime(2030, 1, 1, tzinfo=UTC)

    def ev(seq: int, kind: str, data: Any) -> HistoryEvent:
        return HistoryEvent(eid, seq, kind, at, data)

    events = [
        ev(1, "pending", {}),
        ev(2, "running", {"owner": "w", "epoch": 1, "pos": 9}),
        ev(3, STEP_COMPLETED, {"pos": 0, "name": "a", "result": 1}),
        ev(4, "late_report", {"report": STEP_COMPLETED, "payload": {"pos": 1}}),
        ev(5, STEP_FAILED, {"pos": 1, "name": "b", "error": {"type": "X", "message": "m"}}),
        ev(6, STEP_COMPLETED, {"pos": 0, "name": "a", "result": 2}),  # a duplicate: first wins
        ev(7, STEP_COMPLETED, {"pos": "2", "name": "c"}),  # malformed position: ignored
        ev(8, STEP_COMPLETED, None),
    ]
    journal = Journal.from_history(events)
    assert sorted(journal.entries) == [0, 1]
    assert journal.entries[0].seq == 3
    assert journal.entries[1].kind == STEP_FAILED


# -- results that are not JSON ---------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{1, 2}, object(), math.nan, {"x": b"bytes"}, {"inf": math.inf}],
    ids=["set", "object", "nan", "bytes", "inf"],
)
async def test_non_json_result_is_an_error_and_nothing_is_checkpointed(
    store: Store, ctx: Context, value: Any
) -> None:
    calls = 0

    def returns() -> Any:
        nonlocal calls
        calls += 1
        return value

    before = await store.execution_get(ctx.execution_id)
    with pytest.raises(NotJSONError, match="not JSON-serialisable"):
        await ctx.step_with(returns, retry=RetryPolicy(max_attempts=5, initial_delay=0))
    assert calls == 1  # a programming error is not retried
    assert await journal_events(store, ctx.execution_id) == []
    after = await store.execution_get(ctx.execution_id)
    assert before is not None and after is not None
    assert after.history_seq == before.history_seq
    assert after.status == Status.RUNNING
    assert ctx.steps_run == 0


def test_not_json_error_is_a_type_error() -> None:
    assert issubclass(NotJSONError, TypeError)


# -- retries -------------------------------------------------------------------------------


async def test_failing_twice_then_succeeding_records_three_attempts(
    store: Store, ctx: Context
) -> None:
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Boom(f"try {calls}")
        return "ok"

    assert await ctx.step_with(flaky, retry=FAST) == "ok"
    assert calls == 3
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.kind == STEP_COMPLETED
    assert ev.data["attempts"] == 3
    assert ev.data["result"] == "ok"


async def test_async_step_is_retried_too(store: Store, ctx: Context) -> None:
    calls = 0

    async def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Boom("first")
        return calls

    assert await ctx.step_with(flaky, retry=FAST) == 2
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.data["attempts"] == 2


async def test_non_retryable_error_fails_at_once(store: Store, ctx: Context) -> None:
    calls = 0

    def fatal() -> None:
        nonlocal calls
        calls += 1
        raise Fatal("no point retrying")

    policy = RetryPolicy(max_attempts=5, initial_delay=0, non_retryable=(Fatal,))
    with pytest.raises(StepFailed) as err:
        await ctx.step_with(fatal, retry=policy)
    assert calls == 1
    assert err.value.error_type == "Fatal"
    assert isinstance(err.value.__cause__, Fatal)
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.kind == STEP_FAILED
    assert ev.data["attempts"] == 1
    assert ev.data["error"]["type"] == "Fatal"
    assert ev.data["error"]["message"] == "no point retrying"


async def test_exhausted_retries_record_step_failed(store: Store, ctx: Context) -> None:
    calls = 0

    def always() -> None:
        nonlocal calls
        calls += 1
        raise Boom(f"failure {calls}")

    with pytest.raises(StepFailed) as err:
        await ctx.step_with(always, retry=FAST)
    assert calls == 3
    assert err.value.error_type == "Boom"
    assert err.value.error_message == "failure 3"  # the last error is the one recorded
    assert err.value.step == step_name(always)
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.kind == STEP_FAILED
    assert ev.data["pos"] == 0
    assert ev.data["name"] == step_name(always)
    assert ev.data["attempts"] == 3
    assert ev.data["error"]["type"] == "Boom"
    assert ev.data["error"]["message"] == "failure 3"
    assert "Boom: failure 3" in ev.data["error"]["traceback"]
    ex = await store.execution_get(ctx.execution_id)
    assert ex is not None and ex.status == Status.RUNNING  # the workflow decides what next


async def test_retries_wait_the_policy_delay(ctx: Context) -> None:
    loop = asyncio.get_running_loop()
    times: list[float] = []

    def flaky() -> str:
        times.append(loop.time())
        if len(times) < 3:
            raise Boom("again")
        return "ok"

    policy = RetryPolicy(max_attempts=3, initial_delay=0.02, backoff=2.0, jitter=0.0)
    assert await ctx.step_with(flaky, retry=policy) == "ok"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.018
    assert gaps[1] >= 0.038


async def test_default_policy_retries(ctx: Context) -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Boom("transient")
        return "ok"

    assert await ctx.step(flaky) == "ok"
    assert calls == 2


async def test_interrupt_during_a_retry_backoff_stops_the_step(
    store: Store, ctx: Context
) -> None:
    calls = 0
    loop = asyncio.get_running_loop()

    def flaky() -> None:
        nonlocal calls
        calls += 1
        # the worker asks the run to stop while the step waits for its next try
        loop.call_soon_threadsafe(ctx.interrupt, "worker shutting down")
        raise Boom("again")

    policy = RetryPolicy(max_attempts=10, initial_delay=0.05, jitter=0.0)
    with pytest.raises(ExecutionInterrupted) as err:
        await ctx.step_with(flaky, retry=policy)
    assert err.value.reason == "worker shutting down"
    assert calls == 1
    assert await journal_events(store, ctx.execution_id) == []


# -- fencing ---------------------------------------------------------------------------------


async def _assert_late_report(
    store: Store, ctx: Context, kind: str, reason: str
) -> HistoryEvent:
    events = await history(store, ctx.execution_id)
    late = [e for e in events if e.kind == "late_report"]
    assert len(late) == 1
    (ev,) = late
    assert ev.data["report"] == kind
    assert ev.data["owner"] == OWNER
    assert ev.data["reason"] == reason
    assert ev.data["payload"]["pos"] == 0
    assert not [e for e in events if e.kind in (STEP_COMPLETED, STEP_FAILED)]
    return ev


async def test_checkpoint_after_lease_expiry_is_refused(
    store: Store, ctx: Context, clock: ManualClock
) -> None:
    counter = Counter()
    clock.advance(TTL + timedelta(seconds=1))
    before = await store.execution_get(ctx.execution_id)
    with pytest.raises(ExecutionInterrupted) as err:
        await ctx.step(counter.sync_value, "computed too late")
    assert err.value.reason == "lease_lost"
    assert counter.calls == 1  # it ran; its outcome is fenced out
    assert ctx.interrupted == "lease_lost"
    after = await store.execution_get(ctx.execution_id)
    assert before is not None and after is not None
    assert after.status == before.status == Status.RUNNING
    assert after.lease_owner == OWNER and after.lease_epoch == before.lease_epoch
    ev = await _assert_late_report(store, ctx, STEP_COMPLETED, "lease expired")
    assert ev.data["payload"]["result"] == "computed too late"
    assert ev.data["epoch"] == before.lease_epoch
    # the context stays stopped: the next step does not run at all
    with pytest.raises(ExecutionInterrupted):
        await ctx.step(counter.sync_value, "never")
    assert counter.calls == 1


async def test_checkpoint_after_the_epoch_changed_is_refused(
    store: Store, ctx: Context
) -> None:
    """Claim, release, reclaim: a new epoch (even for the same owner) fences the old run."""
    old = await store.execution_get(ctx.execution_id)
    assert old is not None
    rel = await store.execution_release_if_owned(
        Claim(old.id, OWNER, old.lease_epoch), "test"
    )
    assert rel.applied
    ex, _ = await claim(store, OWNER)
    assert ex.lease_epoch > old.lease_epoch

    counter = Counter()
    with pytest.raises(ExecutionInterrupted, match="lease_lost"):
        await ctx.step(counter.sync_value, "stale")
    assert counter.calls == 1
    after = await store.execution_get(ctx.execution_id)
    assert after is not None
    assert after.status == Status.RUNNING
    assert after.lease_epoch == ex.lease_epoch
    await _assert_late_report(store, ctx, STEP_COMPLETED, "lease is held by another owner or epoch")


async def test_failed_step_after_lease_loss_is_fenced_too(
    store: Store, ctx: Context, clock: ManualClock
) -> None:
    def fails() -> None:
        raise Boom("late failure")

    clock.advance(TTL)  # exactly at expiry: expired (lease_expires_at > now is false)
    with pytest.raises(ExecutionInterrupted, match="lease_lost"):
        await ctx.step_with(fails, retry=RetryPolicy(max_attempts=1))
    ev = await _assert_late_report(store, ctx, STEP_FAILED, "lease expired")
    assert ev.data["payload"]["error"]["type"] == "Boom"


async def test_checkpoint_after_recovery_is_refused(
    store: Store, ctx: Context, clock: ManualClock
) -> None:
    clock.advance(TTL * 2)
    recovered = await store.execution_recover_expired(max_attempts=5)
    assert [r.execution.id for r in recovered] == [ctx.execution_id]
    with pytest.raises(ExecutionInterrupted):
        await ctx.step(Counter().sync_value, "x")
    after = await store.execution_get(ctx.execution_id)
    assert after is not None and after.status == Status.PENDING
    await _assert_late_report(store, ctx, STEP_COMPLETED, "execution is pending")


async def test_checkpoint_just_before_expiry_is_accepted(
    store: Store, ctx: Context, clock: ManualClock
) -> None:
    clock.advance(TTL - timedelta(milliseconds=1))
    assert await ctx.step(Counter().sync_value, 1) == 1
    assert len(await journal_events(store, ctx.execution_id)) == 1


# -- database trouble while checkpointing ------------------------------------------------------


async def test_checkpoint_retries_through_database_trouble(
    store: Store, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed checkpoint write is infrastructure trouble: it is retried (the step is not
    run again, and it is not the step's failure)."""
    counter = Counter()
    failures = 0
    original = store.execution_checkpoint_if_owned

    async def flaky(claim: Claim, kind: str, data: Any) -> Any:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise ConnectionError("connection reset")
        return await original(claim, kind, data)

    monkeypatch.setattr(store, "execution_checkpoint_if_owned", flaky)
    assert await ctx.step_with(counter.sync_value, "v", retry=FAST) == "v"
    assert failures == 2
    assert counter.calls == 1
    (ev,) = await journal_events(store, ctx.execution_id)
    assert ev.data["result"] == "v" and ev.data["attempts"] == 1


async def test_checkpoint_trouble_past_the_lease_stops_the_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the database stays away until the lease can no longer be valid, the run stops
    with ExecutionInterrupted (never a StepFailed the workflow could catch)."""
    await submit(store)
    ex, c = await claim(store)
    valid = [True, True, False]
    ctx = Context(store=store, claim=c, execution_id=ex.id, deployment_id=ex.deployment_id,
                  attempt=ex.attempt, lease_valid=lambda: valid.pop(0) if valid else False)
    calls = 0

    async def down(claim: Claim, kind: str, data: Any) -> Any:
        nonlocal calls
        calls += 1
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(store, "execution_checkpoint_if_owned", down)
    counter = Counter()
    caught: list[BaseException] = []

    async def workflow() -> None:
        try:
            await ctx.step(counter.sync_value, 1)
        except Exception as exc:
            caught.append(exc)

    with pytest.raises(ExecutionInterrupted) as err:
        await workflow()
    assert err.value.reason == "checkpoint failed"
    assert isinstance(err.value.__cause__, ConnectionError)
    assert ctx.interrupted == "checkpoint failed"
    assert caught == []
    assert counter.calls == 1  # the step itself was not retried
    assert calls == 3
    monkeypatch.undo()
    assert await journal_events(store, ex.id) == []


async def test_failed_step_checkpoint_trouble_is_not_a_step_failure(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(store)
    ex, c = await claim(store)
    ctx = Context(store=store, claim=c, execution_id=ex.id, deployment_id=ex.deployment_id,
                  attempt=ex.attempt, lease_valid=lambda: False)

    async def down(claim: Claim, kind: str, data: Any) -> Any:
        raise ConnectionError("database unreachable")

    def fails() -> None:
        raise Boom("the step's own error")

    monkeypatch.setattr(store, "execution_checkpoint_if_owned", down)
    with pytest.raises(ExecutionInterrupted, match="checkpoint failed"):
        await ctx.step_with(fails, retry=RetryPolicy(max_attempts=1))


# -- interruption -------------------------------------------------------------------------------


async def test_interrupt_stops_the_next_step_before_it_runs(
    store: Store, ctx: Context
) -> None:
    counter = Counter()
    assert await ctx.step(counter.sync_value, 1) == 1
    ctx.interrupt("worker shutting down")
    ctx.interrupt("lease_lost")  # the first reason is kept
    assert ctx.interrupted == "worker shutting down"
    with pytest.raises(ExecutionInterrupted) as err:
        await ctx.step(counter.sync_value, 2)
    assert err.value.reason == "worker shutting down"
    assert counter.calls == 1
    assert len(await journal_events(store, ctx.execution_id)) == 1


async def test_interrupt_applies_to_replayed_steps_too(store: Store, ctx: Context) -> None:
    counter = Counter()
    await ctx.step(counter.sync_value, 1)
    again = await replay_ctx(store, ctx)
    again.interrupt("lease_lost")
    with pytest.raises(ExecutionInterrupted):
        await again.step(counter.sync_value, 1)


def test_execution_interrupted_is_a_base_exception() -> None:
    assert issubclass(ExecutionInterrupted, BaseException)
    assert not issubclass(ExecutionInterrupted, Exception)
    e = ExecutionInterrupted("lease_lost")
    assert e.reason == "lease_lost"
    assert str(e) == "lease_lost"


async def test_except_exception_in_workflow_code_does_not_swallow_interruption(
    ctx: Context,
) -> None:
    counter = Counter()
    swallowed: list[BaseException] = []

    async def careless_workflow(c: Context) -> str:
        try:
            await c.step(counter.sync_value, 1)
        except Exception as exc:  # workflow code that "handles everything"
            swallowed.append(exc)
        return "finished anyway"

    ctx.interrupt("lease_lost")
    with pytest.raises(ExecutionInterrupted):
        await careless_workflow(ctx)
    assert swallowed == []
    assert counter.calls == 0
