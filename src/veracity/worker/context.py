"""The workflow context: what a workflow function sees as ``ctx``.

Durable execution by replay: every call the workflow makes through the context (a step, a
sleep, a child, a schedule, a receive, the time) takes the next *position*. Its outcome is
checkpointed in the execution's history in the same fenced write that proves the lease is
still ours. When the execution runs again after a crash, the workflow function is called
again from the top and each position that has a recorded outcome returns it without
running anything. The journal of recorded calls, and how a replayed call is compared with
the record, are in :mod:`veracity.worker.journal`; the exceptions in
:mod:`veracity.worker.errors` (both re-exported here).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import random
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, cast, overload

from veracity.bindings import redact_json, redact_text
from veracity.core.ffqn import InvalidFfqn, validate_ffqn
from veracity.core.params import ParamsShape
from veracity.core.retry import RetryPolicy
from veracity.core.waiting import children_reason, message_reason, sleep_reason
from veracity.models import (
    JSON,
    Claim,
    HistoryEvent,
    Message,
    NewExecution,
    Taken,
    TransitionResult,
)
from veracity.worker.errors import (
    ChildFailed,
    ExecutionInterrupted,
    ExecutionSuspended,
    HistoryEnd,
    InvalidParams,
    JoinSetEmpty,
    NondeterminismError,
    NotJSONError,
    StepFailed,
)
from veracity.worker.http import digestible, step_scope
from veracity.worker.journal import (
    CHILD_SUBMITTED,
    JOIN_NEXT,
    JOURNAL_KINDS,
    MESSAGE_RECEIVED,
    NOW_RECORDED,
    RECV_STARTED,
    RECV_TIMED_OUT,
    SCHEDULED,
    SLEEP_STARTED,
    STEP_COMPLETED,
    STEP_FAILED,
    ChildOutcome,
    Journal,
    args_digest,
    compare_recv,
    compare_sleep,
    compare_spawn,
    compare_step,
    describe,
    describe_sleep,
    describe_spawn,
    outcome_of,
    step_name,
)

if TYPE_CHECKING:
    from veracity.store.protocol import JournalStore
    from veracity.telemetry import Telemetry
    from veracity.worker._http_client import HttpClient

__all__ = [
    "CHILD_SUBMITTED",
    "JOIN_NEXT",
    "JOURNAL_KINDS",
    "MESSAGE_RECEIVED",
    "NOW_RECORDED",
    "RECV_STARTED",
    "RECV_TIMED_OUT",
    "SCHEDULED",
    "SLEEP_STARTED",
    "STEP_COMPLETED",
    "STEP_FAILED",
    "ChildFailed",
    "ChildOutcome",
    "Context",
    "ExecutionInterrupted",
    "ExecutionSuspended",
    "HistoryEnd",
    "InvalidParams",
    "JoinSet",
    "JoinSetEmpty",
    "Journal",
    "NondeterminismError",
    "NotJSONError",
    "Scheduled",
    "StepFailed",
    "args_digest",
    "describe",
    "describe_sleep",
    "describe_spawn",
    "error_info",
    "step_name",
    "to_json_value",
]

PARKED_KINDS = frozenset({"blocked", "pending", "paused", "cancelled"})
"""The state events a durable wait ends a run with (blocked, or at once woken, parked by a
pause or stopped by a cancel), each naming the claim that wrote it."""

P = ParamSpec("P")
R = TypeVar("R")

MAX_TOPIC_LENGTH = 256

DEFAULT_STEP_RETRY = RetryPolicy()


def error_info(exc: BaseException) -> dict[str, str]:
    # secret values (docs/http.md) are redacted from whatever is stored
    return {
        "type": type(exc).__name__,
        "message": redact_text(str(exc)),
        "traceback": redact_text("".join(traceback.format_exception(exc)))[-4000:],
    }


def to_json_value(value: Any, what: str) -> JSON:
    """Check that ``value`` survives a JSON round trip unchanged enough to replay."""
    if value is None or type(value) is bool or type(value) is int:
        return value  # a JSON value as it is, with nothing to redact
    try:
        copied = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise NotJSONError(f"{what} is not JSON-serialisable: {exc}") from None
    return redact_json(copied)  # secret values (docs/http.md) are never stored


class Scheduled(uuid.UUID):
    """What ``ctx.schedule`` returns: the new execution's id, at once. The schedule is
    recorded, and the execution created, with the workflow's next durable write (its next
    step, wait or child, or its end); awaiting the id writes it right away."""

    __slots__ = ("_ctx",)

    def __init__(self, value: uuid.UUID, ctx: Context | None) -> None:
        super().__init__(int=value.int)
        object.__setattr__(self, "_ctx", ctx)

    def __await__(self) -> Generator[Any, None, uuid.UUID]:
        return self._written().__await__()

    async def _written(self) -> uuid.UUID:
        ctx: Context | None = object.__getattribute__(self, "_ctx")
        if ctx is not None:
            await ctx.settle()
        return uuid.UUID(int=self.int)


class JoinSet:
    """Child executions awaited together; ``next()`` returns them in the order they end."""

    def __init__(self, ctx: Context, name: str) -> None:
        self._ctx = ctx
        self.name = name
        self.submitted: list[uuid.UUID] = []
        self.consumed: set[uuid.UUID] = set()

    async def submit(self, ffqn: str, *params: Any) -> uuid.UUID:
        """Start a child execution of ``ffqn`` in this join set; returns its id."""
        return await self._ctx._submit_child(self, ffqn, list(params))

    async def next(self) -> ChildOutcome:
        """The next child of this set to end (in the order they ended), with its result or
        error. Blocks the execution durably until one has ended."""
        return await self._ctx._join_next(self)

    @property
    def remaining(self) -> int:
        return len(self.submitted) - len(self.consumed)


class Context:
    """Passed as the first argument to every workflow function.

    Without a store (``store=None``), the context replays from its journal alone (see
    :mod:`veracity.worker.replayer`): recorded calls return their recorded outcomes and are
    compared as in any replay, and the first call that goes beyond the history raises
    :class:`HistoryEnd` before anything is run, written or waited for. Its clock stands
    still at ``clock_base``.
    """

    def __init__(
        self,
        *,
        store: JournalStore | None,
        claim: Claim | None,
        execution_id: uuid.UUID,
        deployment_id: str,
        attempt: int,
        journal: Journal | None = None,
        rng: random.Random | None = None,
        lease_valid: Callable[[], bool] | None = None,
        clock_base: datetime | None = None,
        signal_seq: int = 0,
        checkpoint: Callable[[Claim, str, JSON], Awaitable[TransitionResult]] | None = None,
        retry: int = 0,
        http: HttpClient | None = None,
        http_source: Callable[[], HttpClient] | None = None,
        claimed_seq: int = 0,
        telemetry: Telemetry | None = None,
        ffqn: str = "",
        shapes: Mapping[str, ParamsShape] | None = None,
    ) -> None:
        self._store = store
        # the parameters each workflow of this worker's app takes: a new child or schedule
        # of one of them is checked against it (docs/workflows.md)
        self._shapes: Mapping[str, ParamsShape] = shapes or {}
        self._telemetry = telemetry
        self._ffqn = ffqn
        # the history's length when this run was claimed: what this claim writes comes after
        self._claimed_seq = claimed_seq
        self._http = http
        self._http_source = http_source
        """Gives ``http`` when the workflow first uses it: a worker whose workflows never
        do never loads httpx (some 45 ms, on the way to its first execution's start)."""
        # a workflow retry starts afresh: the ids of its children, schedules and join sets
        # must not be those of an earlier try's (docs/workflows.md)
        self._try = f"r{retry}:" if retry else ""
        self._claim = claim
        self._journal = journal or Journal()
        self._position = 0
        self._interrupt: str | None = None
        self._rng = rng  # made at the first retry's jitter: seeding one costs a syscall
        self._lease_valid = lease_valid or (lambda: True)
        self._clock_base = clock_base or datetime.now(UTC)
        self._mono_base = time.monotonic()
        self._signal_seq = signal_seq
        self._unwritten: list[tuple[str, JSON]] = []
        self._unwritten_children: list[NewExecution] = []  # scheduled, not yet awaited
        # the worker batches checkpoints of concurrent runs; alone, one statement each
        self._checkpoint_one = checkpoint
        self._join_sets = 0
        self.nondeterminism: NondeterminismError | None = None
        """The first divergence from the journal: the execution fails with it, even if the
        workflow code catches the exception."""
        self.history_end: HistoryEnd | None = None
        """Without a store: where the run first went beyond its history."""
        self._matched: set[int] = set()  # positions replayed as recorded
        self.execution_id = execution_id
        self.deployment_id = deployment_id
        self.attempt = attempt
        self.steps_run = 0
        """Steps actually executed in this run (replayed ones not counted)."""

    # -- signals from the worker ------------------------------------------------------

    def interrupt(self, reason: str) -> None:
        """Ask the run to stop at its next step boundary."""
        if self._interrupt is None:
            self._interrupt = reason

    @property
    def interrupted(self) -> str | None:
        return self._interrupt

    def _check(self) -> None:
        if self.nondeterminism is not None:
            raise self.nondeterminism
        if self.history_end is not None:
            raise self.history_end
        if self._interrupt is not None:
            raise ExecutionInterrupted(self._interrupt)

    @property
    def calls_replayed(self) -> int:
        """Recorded calls this run made again as recorded (served from the journal)."""
        return len(self._matched)

    def _diverged(self, pos: int, recorded: str, new: str) -> NondeterminismError:
        self._matched.discard(pos)
        err = NondeterminismError(pos, recorded, new)
        if self.nondeterminism is None:
            self.nondeterminism = err
        return err

    def _beyond(self, pos: int, call: str, *, waiting: bool = False) -> None:
        """This run goes beyond its recorded history at ``pos``: ``call`` is not recorded
        there (or, ``waiting``, its outcome is not). Without a store the replay stops here,
        before anything is run, written or waited for."""
        if self._store is None:
            end = HistoryEnd(pos, call, waiting=waiting)
            if self.history_end is None:
                self.history_end = end
            raise end

    def _db(self) -> tuple[JournalStore, Claim]:
        """The store and this run's claim, for the writes and reads past the history."""
        if self._store is None or self._claim is None:
            # every call beyond the history stops at ``_beyond`` first: this is a bug, and
            # it is never turned into a silent write
            raise RuntimeError("a replay from the history alone reached for the store")
        return self._store, self._claim

    def finish(self) -> NondeterminismError | None:
        """The workflow function has ended (returned, or raised its own error): a history
        that still holds calls this run never reached was written by other code, which is
        a nondeterminism like a call that differs (kept as the run's first divergence).
        Returns the run's nondeterminism, if any."""
        if self.nondeterminism is None:
            unreached = self._journal.unreached(self._position)
            if unreached:
                self.nondeterminism = NondeterminismError.unreached_calls(unreached)
        return self.nondeterminism

    # -- the workflow API --------------------------------------------------------------

    @property
    def http(self) -> HttpClient:
        """The worker's HTTP client, held to the ``[[http]]`` bindings: usable inside a
        step only (docs/http.md), e.g. ``await ctx.step(fetch, ctx.http, url)``."""
        if self._http is None and self._http_source is not None:
            self._http = self._http_source()  # the worker's, made at its first use
        if self._http is None:
            raise RuntimeError("ctx.http: this context has no HTTP client (a worker gives "
                               "one to each execution it runs)")
        return self._http

    @overload
    async def step(
        self, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    @overload
    async def step(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...

    async def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once, durably: its JSON result (or its error) is
        checkpointed, and on replay the recorded outcome is returned without running it.

        Async functions are awaited; plain functions run in a thread so they cannot block
        the worker. Retries follow the default :class:`RetryPolicy`; use
        :meth:`step_with` to choose another policy or name.
        """
        return await self._step(fn, args, kwargs, None, None)

    async def step_with(
        self,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Like :meth:`step`, with a retry policy and a step name of your choosing."""
        return await self._step(fn, args, kwargs, retry, name)

    async def _step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retry: RetryPolicy | None,
        name: str | None,
    ) -> Any:
        self._check()
        pos = self._next_position()
        label = name or step_name(fn)
        digest = args_digest(digestible(args), kwargs)
        recorded = self._recorded(pos, (STEP_COMPLETED, STEP_FAILED), f"step {label}")
        if recorded is not None:
            return self._replay(pos, label, digest, recorded)
        self._beyond(pos, f"step {label}")
        policy = retry or DEFAULT_STEP_RETRY
        attempts = 0
        while True:
            attempts += 1
            try:
                with step_scope():  # ctx.http sends from here only
                    value = await self._invoke(fn, args, kwargs)
                result = to_json_value(value, f"the result of step {label}")
            except NotJSONError:
                raise
            except Exception as exc:
                if policy.should_retry(attempts, exc):
                    if self._telemetry is not None:
                        self._telemetry.step_retry(self._ffqn)
                    if self._rng is None:
                        self._rng = random.Random()
                    await asyncio.sleep(policy.delay(attempts, self._rng.random()))
                    self._check()
                    continue
                info = error_info(exc)
                await self._checkpoint(STEP_FAILED, {
                    "pos": pos, "name": label, "args": digest, "attempts": attempts,
                    "error": info,
                })
                if self._telemetry is not None:
                    self._telemetry.step(self._ffqn, "failed")
                raise StepFailed(label, info["type"], info["message"]) from exc
            self.steps_run += 1
            await self._checkpoint(STEP_COMPLETED, {
                "pos": pos, "name": label, "args": digest, "attempts": attempts,
                "result": result,
            })
            if self._telemetry is not None:
                self._telemetry.step(self._ffqn, "completed")
            return cast(Any, result)

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    async def _invoke(
        fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        value = await asyncio.to_thread(fn, *args, **kwargs)
        if inspect.isawaitable(value):
            return await value
        return value

    def _replay(self, pos: int, label: str, digest: str | None, recorded: HistoryEvent) -> Any:
        data = recorded.data
        mismatch = compare_step(recorded, label, digest)
        if mismatch is not None:
            raise self._diverged(pos, *mismatch)
        if recorded.kind == STEP_FAILED:
            err = data.get("error") or {}
            raise StepFailed(label, str(err.get("type")), str(err.get("message")))
        return data.get("result")

    async def _checkpoint(self, kind: str, data: dict[str, JSON]) -> None:
        """Write a journal event under the lease (with any recorded-but-unwritten times
        before it). Database trouble is retried while the lease can still be valid; then the
        run stops (ExecutionInterrupted, which workflow code cannot swallow): an
        infrastructure error is never the workflow's own error."""
        pending = [*self._unwritten, (kind, data)]
        children = list(self._unwritten_children)
        store, claim = self._db()

        async def write() -> TransitionResult:
            if children:
                return await store.execution_spawn_if_owned(claim, children, pending)
            if len(pending) == 1:
                if self._checkpoint_one is not None:
                    return await self._checkpoint_one(claim, kind, data)
                return await store.execution_checkpoint_if_owned(claim, kind, data)
            return await store.execution_spawn_if_owned(claim, [], pending)

        outcome = await self._retrying(write, landed=self._written(pending))
        self._unwritten.clear()
        self._unwritten_children.clear()
        if not outcome.applied:
            # fenced out: someone else owns the execution now; stop without writing more
            if self._telemetry is not None and outcome.execution is not None:
                self._telemetry.late("worker")  # the refused write is kept as a late report
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")

    async def _retrying(self, write: Callable[[], Awaitable[R]],
                        landed: Callable[[], Awaitable[R | None]] | None = None) -> R:
        """``write`` until it answers, while the lease can still be valid. A write whose
        answer was lost (the connection died after the commit) may have landed: before
        writing again, ``landed`` looks for it in the history, so that nothing this run
        records is recorded twice (docs/workers.md)."""
        delay = 0.05
        in_doubt = False
        while True:
            try:
                if in_doubt and landed is not None:
                    found = await landed()
                    if found is not None:
                        return found
                return await write()
            except Exception as exc:
                if not self._lease_valid():
                    self.interrupt("checkpoint failed")
                    raise ExecutionInterrupted("checkpoint failed") from exc
                in_doubt = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _since_claim(self) -> list[HistoryEvent]:
        """What the history holds after this run was claimed."""
        store, _ = self._db()
        return await store.history_list(self.execution_id, after_seq=self._claimed_seq,
                                        limit=100_000)

    def _written(self, events: list[tuple[str, JSON]]
                 ) -> Callable[[], Awaitable[TransitionResult | None]]:
        """Whether journal ``events``, written in one transaction, are in the history since
        this claim (their last one is: its position is unique within a claim)."""
        kind, data = events[-1]
        pos = data.get("pos") if isinstance(data, dict) else None

        async def landed() -> TransitionResult | None:
            if pos is None:
                return None
            for ev in await self._since_claim():
                if ev.kind == kind and isinstance(ev.data, Mapping) \
                        and ev.data.get("pos") == pos:
                    return TransitionResult(True, None, "written before its answer was lost")
            return None

        return landed

    # -- positions, time, and the durable waits ------------------------------------------

    def _next_position(self) -> int:
        pos = self._position
        self._position += 1
        return pos

    def _recorded(self, pos: int, kinds: tuple[str, ...], call: str) -> HistoryEvent | None:
        """The journal event recorded at ``pos``, checked to be of the same call."""
        events = self._journal.at(pos)
        if not events:
            return None
        if events[0].kind not in kinds:
            raise self._diverged(pos, describe(events[0]), call)
        self._matched.add(pos)  # until a closer comparison finds it differs
        return events[0]

    def _estimate_now(self) -> datetime:
        """The database's time, estimated as the claim's time (read from the database) plus
        the time elapsed since, by the monotonic clock: never this host's wall clock. A
        replay without a store stands still at the time its history was read."""
        if self._store is None:
            return self._clock_base
        return self._clock_base + timedelta(seconds=time.monotonic() - self._mono_base)

    def now(self) -> datetime:
        """The current time, recorded: a replay sees the same value at the same point."""
        self._check()
        pos = self._next_position()
        recorded = self._recorded(pos, (NOW_RECORDED,), "now()")
        if recorded is not None:
            return datetime.fromisoformat(str(recorded.data["value"]))
        self._beyond(pos, "now()")
        value = self._estimate_now()
        # written with the next journal write: until then nothing durable depended on it
        self._unwritten.append((NOW_RECORDED, {"pos": pos, "value": value.isoformat()}))
        return value

    async def sleep(self, duration: timedelta | float) -> None:
        """Sleep durably: the execution blocks, holds no lease and no worker, and resumes
        on any worker at the wake time (surviving restarts of every process)."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("sleep duration must be a finite number of seconds, 0 or more")
        await self._sleep(None, seconds)

    async def sleep_until(self, when: datetime) -> None:
        """Sleep durably until ``when`` (timezone-aware)."""
        if when.tzinfo is None:
            raise ValueError("sleep_until needs a timezone-aware time")
        await self._sleep(when, None)

    async def _sleep(self, when: datetime | None, seconds: float | None) -> None:
        self._check()
        pos = self._next_position()
        request: dict[str, JSON] = (
            {"seconds": seconds} if seconds is not None
            else {"when": when.isoformat() if when else None})
        call = describe_sleep(seconds, request.get("when"))
        recorded = self._recorded(pos, (SLEEP_STARTED,), call)
        events: list[tuple[str, JSON]] = []
        if recorded is not None:
            mismatch = compare_sleep(recorded, seconds, when, call)
            if mismatch is not None:
                raise self._diverged(pos, *mismatch)
            until = datetime.fromisoformat(str(recorded.data["until"]))
        else:
            self._beyond(pos, call)
            until = (when if when is not None
                     else self._estimate_now() + timedelta(seconds=seconds or 0))
            events.append((SLEEP_STARTED, {"pos": pos, "until": until.isoformat(), **request}))
        if until <= self._estimate_now():
            if events:
                self._unwritten.extend(events)
            return
        self._beyond(pos, call, waiting=True)  # recorded, not over when the history ends
        await self._block(until, self._signal_seq, events, sleep_reason())

    async def _block(
        self, wake_at: datetime | None, seen: int, events: list[tuple[str, JSON]], reason: str
    ) -> NoReturn:
        if self._unwritten_children:
            await self._flush()  # the block statement writes events, not executions
        pending = [*self._unwritten, *events]
        store, claim = self._db()
        async def parked() -> TransitionResult | None:
            # a block whose answer was lost may have landed: this claim's own state event
            for ev in await self._since_claim():
                if ev.kind in PARKED_KINDS and isinstance(ev.data, Mapping) \
                        and ev.data.get("owner") == claim.owner \
                        and ev.data.get("epoch") == claim.epoch:
                    return TransitionResult(True, None, "written before its answer was lost")
            return None

        outcome = await self._retrying(lambda: store.execution_block_if_owned(
            claim, wake_at=wake_at, seen_signal=seen, events=pending, reason=reason),
            landed=parked)
        self._unwritten.clear()
        if not outcome.applied:
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")
        raise ExecutionSuspended(reason)

    # children

    def join_set(self) -> JoinSet:
        """A new join set for child executions."""
        name = f"{self._try}js{self._join_sets}"
        self._join_sets += 1
        return JoinSet(self, name)

    async def call(self, ffqn: str, *params: Any) -> JSON:
        """Run one child execution and wait for it: its result, or ChildFailed."""
        js = self.join_set()
        await self._submit_child(js, ffqn, list(params), via="ctx.call")
        outcome = await js.next()
        if not outcome.ok:
            raise ChildFailed(outcome)
        return outcome.result

    def schedule(
        self, ffqn: str, *params: Any, execution_id: uuid.UUID | str | None = None
    ) -> Scheduled:
        """Create a top-level execution (not a child: nothing waits for it, cancelling this
        one does not touch it), recorded so that a replay never creates it twice. Returns
        its id at once; the execution is created with this workflow's next durable write
        (or its end), in the same transaction as the record. ``await ctx.schedule(...)``
        writes it before going on."""
        self._check()
        validate_ffqn_for_workflow(ffqn)
        if execution_id is not None and not isinstance(execution_id, uuid.UUID):
            execution_id = uuid.UUID(execution_id)  # ValueError for a malformed id
        values = to_json_value(list(params), f"the parameters of {ffqn}")
        pos = self._next_position()
        call = describe_spawn("schedule", ffqn, values)
        recorded = self._recorded(pos, (SCHEDULED,), call)
        if recorded is not None:
            self._same_spawn(pos, recorded, ffqn, values, call)
            return Scheduled(uuid.UUID(str(recorded.data["execution_id"])), None)
        self._fits("ctx.schedule", ffqn, values)
        self._beyond(pos, call)
        new_id = execution_id or uuid.uuid5(self.execution_id, f"schedule:{self._try}{pos}")
        self._unwritten_children.append(
            NewExecution(ffqn=ffqn, params=values, deployment_id=self.deployment_id, id=new_id))
        self._unwritten.append((SCHEDULED, {"pos": pos, "execution_id": str(new_id),
                                            "ffqn": ffqn, "params": values}))
        return Scheduled(new_id, self)

    def _same_spawn(self, pos: int, recorded: HistoryEvent, ffqn: str, params: JSON,
                    call: str) -> None:
        """A recorded child or schedule is the same call: same name, same parameters."""
        mismatch = compare_spawn(recorded, ffqn, params, call)
        if mismatch is not None:
            raise self._diverged(pos, *mismatch)

    async def settle(self) -> None:
        """Write what this run recorded that others depend on (executions it scheduled
        without awaiting them). The worker calls it before it completes or fails the run."""
        if self._unwritten_children:
            await self._flush()

    async def _spawn(self, child: NewExecution, event: tuple[str, JSON]) -> None:
        pending = [*self._unwritten, event]
        children = [*self._unwritten_children, child]
        store, claim = self._db()
        outcome = await self._retrying(
            lambda: store.execution_spawn_if_owned(claim, children, pending),
            landed=self._written(pending))
        self._unwritten.clear()
        self._unwritten_children.clear()
        if not outcome.applied:
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")

    def _fits(self, via: str, ffqn: str, params: JSON) -> None:
        """A new child or schedule (not recorded): its params must fit the signature of
        its workflow, if this worker's app registers it; else InvalidParams, before
        anything is written. Its position stays empty, so a replay checks it again."""
        shape = self._shapes.get(ffqn)
        if shape is None or not isinstance(params, list):
            return
        problem = shape.problem(params)
        if problem is not None:
            raise InvalidParams(f"{via}({ffqn!r}, ...)", ffqn, problem)

    async def _submit_child(self, js: JoinSet, ffqn: str, params: list[Any], *,
                            via: str = "js.submit") -> uuid.UUID:
        self._check()
        validate_ffqn_for_workflow(ffqn)
        values = to_json_value(params, f"the parameters of {ffqn}")
        pos = self._next_position()
        call = describe_spawn("submit", ffqn, values)
        recorded = self._recorded(pos, (CHILD_SUBMITTED,), call)
        if recorded is not None:
            self._same_spawn(pos, recorded, ffqn, values, call)
            child_id = uuid.UUID(str(recorded.data["child_id"]))
            js.submitted.append(child_id)
            return child_id
        self._fits(via, ffqn, values)
        self._beyond(pos, call)
        child_id = uuid.uuid5(self.execution_id, f"child:{self._try}{pos}")
        await self._spawn(
            NewExecution(ffqn=ffqn, params=values, deployment_id=self.deployment_id,
                         id=child_id, parent_id=self.execution_id, join_set=js.name),
            (CHILD_SUBMITTED, {"pos": pos, "child_id": str(child_id), "ffqn": ffqn,
                               "params": values, "join_set": js.name}),
        )
        js.submitted.append(child_id)
        return child_id

    async def _join_next(self, js: JoinSet) -> ChildOutcome:
        self._check()
        pos = self._next_position()
        call = f"next() of join set {js.name}"
        recorded = self._recorded(pos, (JOIN_NEXT,), call)
        if recorded is not None:
            outcome = outcome_of(recorded.data)
            js.consumed.add(outcome.execution_id)
            return outcome
        if js.remaining <= 0:
            raise JoinSetEmpty(f"join set {js.name} has no child left to wait for")
        self._beyond(pos, call)
        store, _ = self._db()
        children, signal = await self._retrying(
            lambda: store.execution_children(self.execution_id, js.name))
        for child in children:
            if (child.status.is_terminal and child.id in js.submitted
                    and child.id not in js.consumed):
                data: dict[str, JSON] = {
                    "pos": pos, "join_set": js.name, "child_id": str(child.id),
                    "ffqn": child.ffqn, "status": str(child.status),
                    "result": child.result, "error": child.error,
                }
                await self._checkpoint(JOIN_NEXT, data)
                js.consumed.add(child.id)
                return outcome_of(data)
        await self._block(None, signal, [], children_reason(js.name))

    # messages

    async def recv(self, topic: str, timeout: timedelta | float | None = None) -> JSON:
        """The next message sent to this execution on ``topic`` (delivered exactly once).
        Blocks the execution durably until one arrives; with ``timeout``, raises
        TimeoutError once it has passed."""
        if not isinstance(topic, str) or not 1 <= len(topic) <= MAX_TOPIC_LENGTH:
            raise ValueError(f"topic must be 1 to {MAX_TOPIC_LENGTH} characters")
        seconds: float | None = None
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            if not math.isfinite(seconds) or seconds < 0:
                raise ValueError("timeout must be a finite number of seconds, 0 or more")
        self._check()
        pos = self._next_position()
        call = f"recv({topic!r})"
        first = self._recorded(pos, (RECV_STARTED, MESSAGE_RECEIVED, RECV_TIMED_OUT), call)
        if first is not None:
            mismatch = compare_recv(first, topic, call)
            if mismatch is not None:
                raise self._diverged(pos, *mismatch)
        got = self._journal.find(pos, MESSAGE_RECEIVED)
        if got is not None:
            return got.data.get("payload")
        if self._journal.find(pos, RECV_TIMED_OUT) is not None:
            raise TimeoutError(f"no message on {topic!r} within the timeout")
        # recorded as started, with no message yet when the history ends: waiting
        self._beyond(pos, call, waiting=first is not None)
        started = self._journal.find(pos, RECV_STARTED)
        deadline: datetime | None = None
        events: list[tuple[str, JSON]] = []
        if started is not None:
            if started.data.get("deadline"):
                deadline = datetime.fromisoformat(str(started.data["deadline"]))
        elif seconds is not None:
            deadline = self._estimate_now() + timedelta(seconds=seconds)
        if self._unwritten:
            await self._flush()
        store, claim = self._db()
        async def received() -> Taken | None:
            # a take whose answer was lost may have consumed a message: it is this one
            for ev in await self._since_claim():
                if ev.kind == MESSAGE_RECEIVED and isinstance(ev.data, Mapping) \
                        and ev.data.get("pos") == pos:
                    return Taken(True, Message(
                        id=int(cast(int, ev.data.get("message_id"))),
                        execution_id=self.execution_id, topic=topic,
                        payload=ev.data.get("payload"), created_at=ev.at, consumed_at=ev.at,
                        consumed_pos=pos), self._signal_seq)
            return None

        taken = await self._retrying(
            lambda: store.execution_take_message_if_owned(claim, topic, pos),
            landed=received)
        if not taken.applied:
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")
        if taken.message is not None:
            return taken.message.payload
        if deadline is not None and deadline <= self._estimate_now():
            await self._checkpoint(RECV_TIMED_OUT, {"pos": pos, "topic": topic})
            raise TimeoutError(f"no message on {topic!r} within the timeout")
        if started is None:
            events.append((RECV_STARTED, {
                "pos": pos, "topic": topic,
                "deadline": deadline.isoformat() if deadline else None}))
        await self._block(deadline, taken.signal_seq, events, message_reason(topic))

    async def _flush(self) -> None:
        pending = list(self._unwritten)
        children = list(self._unwritten_children)
        store, claim = self._db()
        outcome = await self._retrying(
            lambda: store.execution_spawn_if_owned(claim, children, pending),
            landed=self._written(pending) if pending else None)
        self._unwritten.clear()
        self._unwritten_children.clear()
        if not outcome.applied:
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")


def validate_ffqn_for_workflow(ffqn: str) -> None:
    try:
        validate_ffqn(ffqn)
    except InvalidFfqn as exc:
        raise ValueError(str(exc)) from None
