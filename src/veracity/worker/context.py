"""The workflow context: what a workflow function sees as ``ctx``.

Durable execution by replay: every call the workflow makes through the context (a step,
for now) takes the next *position*. Its outcome is checkpointed in the execution's history
in the same fenced write that proves the lease is still ours. When the execution runs
again after a crash, the workflow function is called again from the top and each position
that has a recorded outcome returns it without running anything.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import math
import random
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, cast, overload

from veracity.bindings import redact_json, redact_text
from veracity.core.ffqn import InvalidFfqn, validate_ffqn
from veracity.core.retry import RetryPolicy
from veracity.core.states import Status
from veracity.models import JSON, Claim, HistoryEvent, NewExecution, TransitionResult
from veracity.worker.http import HttpClient, digestible, step_scope

if TYPE_CHECKING:
    from veracity.store.protocol import JournalStore

P = ParamSpec("P")
R = TypeVar("R")

STEP_COMPLETED = "step_completed"
STEP_FAILED = "step_failed"
NOW_RECORDED = "now_recorded"
SLEEP_STARTED = "sleep_started"
CHILD_SUBMITTED = "child_submitted"
SCHEDULED = "scheduled"
JOIN_NEXT = "join_next"
RECV_STARTED = "recv_started"
MESSAGE_RECEIVED = "message_received"
RECV_TIMED_OUT = "recv_timed_out"
JOURNAL_KINDS = frozenset({
    STEP_COMPLETED, STEP_FAILED, NOW_RECORDED, SLEEP_STARTED, CHILD_SUBMITTED, SCHEDULED,
    JOIN_NEXT, RECV_STARTED, MESSAGE_RECEIVED, RECV_TIMED_OUT,
})
MAX_TOPIC_LENGTH = 256

DEFAULT_STEP_RETRY = RetryPolicy()


class ExecutionInterrupted(BaseException):
    """Raised at a step boundary when the run must stop: the lease was lost, or the worker
    is shutting down. A BaseException, so that ``except Exception`` in workflow code does not
    swallow it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ExecutionSuspended(BaseException):
    """Raised when the workflow entered a durable wait (sleep, children, message): the
    execution is blocked in the database and this run ends without holding anything."""


class StepFailed(Exception):
    """A step failed after its retries. The same exception (type name and message of the
    original error) is raised on every replay, so workflow code that catches it behaves the
    same each time."""

    def __init__(self, step: str, error_type: str, message: str) -> None:
        super().__init__(f"step {step} failed: {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.error_message = message


class NotJSONError(TypeError):
    """A step returned a value that cannot be stored as JSON."""


class NondeterminismError(Exception):
    """On replay, the workflow made a different call than the one recorded at a position."""

    def __init__(self, position: int, recorded: str, new: str) -> None:
        super().__init__(
            f"nondeterminism at position {position}: the history has {recorded}, "
            f"but the workflow now calls {new}"
        )
        self.position = position
        self.recorded = recorded
        self.new = new


class ChildFailed(Exception):
    """``ctx.call`` of a child that did not complete."""

    def __init__(self, outcome: ChildOutcome) -> None:
        super().__init__(
            f"child {outcome.execution_id} ({outcome.ffqn}) ended {outcome.status}: "
            f"{outcome.error}"
        )
        self.outcome = outcome


class JoinSetEmpty(Exception):
    """``next()`` on a join set with no child left to wait for."""


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How a child execution ended, as ``JoinSet.next()`` returns it."""

    execution_id: uuid.UUID
    ffqn: str
    status: Status
    result: JSON
    error: JSON

    @property
    def ok(self) -> bool:
        return self.status == Status.COMPLETED


def step_name(fn: Callable[..., Any]) -> str:
    """A name that is the same in every process: never an address or a repr."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    qualname = getattr(fn, "__qualname__", None)
    if qualname is None:  # a callable object: name its class
        cls = type(fn)
        return f"{cls.__module__}.{cls.__qualname__}"
    return f"{getattr(fn, '__module__', None) or '?'}.{qualname}"


def error_info(exc: BaseException) -> dict[str, str]:
    # secret values (docs/http.md) are redacted from whatever is stored
    return {
        "type": type(exc).__name__,
        "message": redact_text(str(exc)),
        "traceback": redact_text("".join(traceback.format_exception(exc)))[-4000:],
    }


def to_json_value(value: Any, what: str) -> JSON:
    """Check that ``value`` survives a JSON round trip unchanged enough to replay."""
    try:
        copied = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise NotJSONError(f"{what} is not JSON-serialisable: {exc}") from None
    return redact_json(copied)  # secret values (docs/http.md) are never stored


@dataclass
class Journal:
    """The recorded outcomes of an execution's earlier runs, by position."""

    entries: dict[int, HistoryEvent] = field(default_factory=dict)
    """The first journal event at each position."""
    by_pos: dict[int, list[HistoryEvent]] = field(default_factory=dict)
    """Every journal event at each position (a receive records its start, then its
    message or its timeout)."""

    @classmethod
    def from_history(cls, events: list[HistoryEvent]) -> Journal:
        entries: dict[int, HistoryEvent] = {}
        by_pos: dict[int, list[HistoryEvent]] = {}
        for ev in events:
            if ev.kind in JOURNAL_KINDS and isinstance(ev.data, Mapping):
                pos = ev.data.get("pos")
                if isinstance(pos, int):
                    entries.setdefault(pos, ev)
                    by_pos.setdefault(pos, []).append(ev)
        return cls(entries, by_pos)

    def at(self, pos: int) -> list[HistoryEvent]:
        return self.by_pos.get(pos, [])

    def find(self, pos: int, kind: str) -> HistoryEvent | None:
        for ev in self.at(pos):
            if ev.kind == kind:
                return ev
        return None


def describe(ev: HistoryEvent) -> str:
    """A journal event as a call, for nondeterminism messages."""
    data = ev.data
    if ev.kind in (STEP_COMPLETED, STEP_FAILED):
        return f"step {data.get('name')}"
    if ev.kind == SLEEP_STARTED:
        return describe_sleep(data.get("seconds"), data.get("when"))
    if ev.kind in (CHILD_SUBMITTED, SCHEDULED):
        verb = "submit" if ev.kind == CHILD_SUBMITTED else "schedule"
        return describe_spawn(verb, str(data.get("ffqn")), data.get("params"))
    if ev.kind == JOIN_NEXT:
        return f"next() of join set {data.get('join_set')}"
    if ev.kind in (RECV_STARTED, MESSAGE_RECEIVED, RECV_TIMED_OUT):
        return f"recv({data.get('topic')!r})"
    if ev.kind == NOW_RECORDED:
        return "now()"
    return ev.kind


def describe_sleep(seconds: Any, when: Any) -> str:
    if seconds is not None:
        return f"sleep({seconds:g}s)" if isinstance(seconds, int | float) else "sleep"
    if when is not None:
        return f"sleep_until({when})"
    return "sleep"


def _same_sleep(data: Mapping[str, Any], seconds: float | None, when: datetime | None) -> bool:
    """Whether a recorded sleep asked for what this one asks (histories written before the
    request was recorded are taken as the same)."""
    if "seconds" in data or "when" in data:
        if seconds is not None:
            return data.get("seconds") == seconds
        recorded = data.get("when")
        return recorded is not None and when is not None and (
            datetime.fromisoformat(str(recorded)) == when)
    return True


def describe_spawn(verb: str, ffqn: str, params: Any) -> str:
    if params is None:
        return f"{verb} {ffqn}"
    shown = json.dumps(params, separators=(",", ":"))
    return f"{verb} {ffqn}({shown[1:-1] if len(shown) <= 80 else shown[1:77] + '...'})"


def args_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """A step's arguments, fingerprinted to tell on replay whether they changed; None when
    they are not JSON (an object's repr may differ from run to run: not compared then)."""
    try:
        text = json.dumps([list(args), kwargs], sort_keys=True, allow_nan=False,
                          separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    """Passed as the first argument to every workflow function."""

    def __init__(
        self,
        *,
        store: JournalStore,
        claim: Claim,
        execution_id: uuid.UUID,
        deployment_id: str,
        attempt: int,
        journal: Journal | None = None,
        rng: random.Random | None = None,
        lease_valid: Callable[[], bool] | None = None,
        clock_base: datetime | None = None,
        signal_seq: int = 0,
        checkpoint: Callable[[Claim, str, JSON], Awaitable[TransitionResult]] | None = None,
        http: HttpClient | None = None,
    ) -> None:
        self._store = store
        self._http = http
        self._claim = claim
        self._journal = journal or Journal()
        self._position = 0
        self._interrupt: str | None = None
        self._rng = rng or random.Random()
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
        if self._interrupt is not None:
            raise ExecutionInterrupted(self._interrupt)

    def _diverged(self, pos: int, recorded: str, new: str) -> NondeterminismError:
        err = NondeterminismError(pos, recorded, new)
        if self.nondeterminism is None:
            self.nondeterminism = err
        return err

    # -- the workflow API --------------------------------------------------------------

    @property
    def http(self) -> HttpClient:
        """The worker's HTTP client, held to the ``[[http]]`` bindings: usable inside a
        step only (docs/http.md), e.g. ``await ctx.step(fetch, ctx.http, url)``."""
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
                    await asyncio.sleep(policy.delay(attempts, self._rng.random()))
                    self._check()
                    continue
                info = error_info(exc)
                await self._checkpoint(STEP_FAILED, {
                    "pos": pos, "name": label, "args": digest, "attempts": attempts,
                    "error": info,
                })
                raise StepFailed(label, info["type"], info["message"]) from exc
            self.steps_run += 1
            await self._checkpoint(STEP_COMPLETED, {
                "pos": pos, "name": label, "args": digest, "attempts": attempts,
                "result": result,
            })
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
        recorded_name = str(data.get("name"))
        if recorded_name != label:
            raise self._diverged(pos, f"step {recorded_name}", f"step {label}")
        was = data.get("args")
        if was is not None and digest is not None and was != digest:
            raise self._diverged(pos, f"step {label} with arguments {was}",
                                 f"step {label} with other arguments ({digest})")
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

        async def write() -> TransitionResult:
            if children:
                return await self._store.execution_spawn_if_owned(self._claim, children,
                                                                  pending)
            if len(pending) == 1:
                if self._checkpoint_one is not None:
                    return await self._checkpoint_one(self._claim, kind, data)
                return await self._store.execution_checkpoint_if_owned(self._claim, kind, data)
            return await self._store.execution_spawn_if_owned(self._claim, [], pending)

        outcome = await self._retrying(write)
        self._unwritten.clear()
        self._unwritten_children.clear()
        if not outcome.applied:
            # fenced out: someone else owns the execution now; stop without writing more
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")

    async def _retrying(self, write: Callable[[], Awaitable[R]]) -> R:
        delay = 0.05
        while True:
            try:
                return await write()
            except Exception as exc:
                if not self._lease_valid():
                    self.interrupt("checkpoint failed")
                    raise ExecutionInterrupted("checkpoint failed") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

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
        return events[0]

    def _estimate_now(self) -> datetime:
        """The database's time, estimated as the claim's time (read from the database) plus
        the time elapsed since, by the monotonic clock: never this host's wall clock."""
        return self._clock_base + timedelta(seconds=time.monotonic() - self._mono_base)

    def now(self) -> datetime:
        """The current time, recorded: a replay sees the same value at the same point."""
        self._check()
        pos = self._next_position()
        recorded = self._recorded(pos, (NOW_RECORDED,), "now()")
        if recorded is not None:
            return datetime.fromisoformat(str(recorded.data["value"]))
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
            if not _same_sleep(recorded.data, seconds, when):
                raise self._diverged(pos, describe(recorded), call)
            until = datetime.fromisoformat(str(recorded.data["until"]))
        else:
            until = (when if when is not None
                     else self._estimate_now() + timedelta(seconds=seconds or 0))
            events.append((SLEEP_STARTED, {"pos": pos, "until": until.isoformat(), **request}))
        if until <= self._estimate_now():
            if events:
                self._unwritten.extend(events)
            return
        await self._block(until, self._signal_seq, events, "sleep")

    async def _block(
        self, wake_at: datetime | None, seen: int, events: list[tuple[str, JSON]], reason: str
    ) -> NoReturn:
        if self._unwritten_children:
            await self._flush()  # the block statement writes events, not executions
        pending = [*self._unwritten, *events]
        outcome = await self._retrying(lambda: self._store.execution_block_if_owned(
            self._claim, wake_at=wake_at, seen_signal=seen, events=pending, reason=reason))
        self._unwritten.clear()
        if not outcome.applied:
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")
        raise ExecutionSuspended(reason)

    # children

    def join_set(self) -> JoinSet:
        """A new join set for child executions."""
        name = f"js{self._join_sets}"
        self._join_sets += 1
        return JoinSet(self, name)

    async def call(self, ffqn: str, *params: Any) -> JSON:
        """Run one child execution and wait for it: its result, or ChildFailed."""
        js = self.join_set()
        await js.submit(ffqn, *params)
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
        new_id = execution_id or uuid.uuid5(self.execution_id, f"schedule:{pos}")
        self._unwritten_children.append(
            NewExecution(ffqn=ffqn, params=values, deployment_id=self.deployment_id, id=new_id))
        self._unwritten.append((SCHEDULED, {"pos": pos, "execution_id": str(new_id),
                                            "ffqn": ffqn, "params": values}))
        return Scheduled(new_id, self)

    def _same_spawn(self, pos: int, recorded: HistoryEvent, ffqn: str, params: JSON,
                    call: str) -> None:
        """A recorded child or schedule is the same call: same name, same parameters."""
        data = recorded.data
        if data.get("ffqn") != ffqn or ("params" in data and data["params"] != params):
            raise self._diverged(pos, describe(recorded), call)

    async def settle(self) -> None:
        """Write what this run recorded that others depend on (executions it scheduled
        without awaiting them). The worker calls it before it completes or fails the run."""
        if self._unwritten_children:
            await self._flush()

    async def _spawn(self, child: NewExecution, event: tuple[str, JSON]) -> None:
        pending = [*self._unwritten, event]
        children = [*self._unwritten_children, child]
        outcome = await self._retrying(
            lambda: self._store.execution_spawn_if_owned(self._claim, children, pending))
        self._unwritten.clear()
        self._unwritten_children.clear()
        if not outcome.applied:
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")

    async def _submit_child(self, js: JoinSet, ffqn: str, params: list[Any]) -> uuid.UUID:
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
        child_id = uuid.uuid5(self.execution_id, f"child:{pos}")
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
        recorded = self._recorded(pos, (JOIN_NEXT,), f"next() of join set {js.name}")
        if recorded is not None:
            outcome = _outcome(recorded.data)
            js.consumed.add(outcome.execution_id)
            return outcome
        if js.remaining <= 0:
            raise JoinSetEmpty(f"join set {js.name} has no child left to wait for")
        children, signal = await self._retrying(
            lambda: self._store.execution_children(self.execution_id, js.name))
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
                return _outcome(data)
        await self._block(None, signal, [], f"waiting for a child of join set {js.name}")

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
        if first is not None and first.data.get("topic") != topic:
            raise self._diverged(pos, describe(first), call)
        got = self._journal.find(pos, MESSAGE_RECEIVED)
        if got is not None:
            return got.data.get("payload")
        if self._journal.find(pos, RECV_TIMED_OUT) is not None:
            raise TimeoutError(f"no message on {topic!r} within the timeout")
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
        taken = await self._retrying(
            lambda: self._store.execution_take_message_if_owned(self._claim, topic, pos))
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
        await self._block(deadline, taken.signal_seq, events,
                          f"waiting for a message on {topic!r}")

    async def _flush(self) -> None:
        pending = list(self._unwritten)
        children = list(self._unwritten_children)
        outcome = await self._retrying(
            lambda: self._store.execution_spawn_if_owned(self._claim, children, pending))
        self._unwritten.clear()
        self._unwritten_children.clear()
        if not outcome.applied:
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")


def _outcome(data: Mapping[str, Any]) -> ChildOutcome:
    return ChildOutcome(
        execution_id=uuid.UUID(str(data["child_id"])),
        ffqn=str(data.get("ffqn")),
        status=Status(str(data["status"])),
        result=data.get("result"),
        error=data.get("error"),
    )


def validate_ffqn_for_workflow(ffqn: str) -> None:
    try:
        validate_ffqn(ffqn)
    except InvalidFfqn as exc:
        raise ValueError(str(exc)) from None
