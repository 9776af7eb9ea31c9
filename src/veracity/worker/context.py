"""The workflow context: what a workflow function sees as ``ctx``.

Durable execution by replay: every call the workflow makes through the context (a step,
for now) takes the next *position*. Its outcome is checkpointed in the execution's history
in the same fenced write that proves the lease is still ours. When the execution runs
again after a crash, the workflow function is called again from the top and each position
that has a recorded outcome returns it without running anything.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

from veracity.core.retry import RetryPolicy
from veracity.models import JSON, Claim, HistoryEvent

if TYPE_CHECKING:
    from veracity.store.protocol import Store

P = ParamSpec("P")
R = TypeVar("R")

STEP_COMPLETED = "step_completed"
STEP_FAILED = "step_failed"
JOURNAL_KINDS = frozenset({STEP_COMPLETED, STEP_FAILED})

DEFAULT_STEP_RETRY = RetryPolicy()


class ExecutionInterrupted(BaseException):
    """Raised at a step boundary when the run must stop: the lease was lost, or the worker
    is shutting down. A BaseException, so that ``except Exception`` in workflow code does not
    swallow it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


def step_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qualname}"


def error_info(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }


def to_json_value(value: Any, what: str) -> JSON:
    """Check that ``value`` survives a JSON round trip unchanged enough to replay."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise NotJSONError(f"{what} is not JSON-serialisable: {exc}") from None


@dataclass
class Journal:
    """The recorded outcomes of an execution's earlier runs, by position."""

    entries: dict[int, HistoryEvent] = field(default_factory=dict)

    @classmethod
    def from_history(cls, events: list[HistoryEvent]) -> Journal:
        entries: dict[int, HistoryEvent] = {}
        for ev in events:
            if ev.kind in JOURNAL_KINDS and isinstance(ev.data, Mapping):
                pos = ev.data.get("pos")
                if isinstance(pos, int) and pos not in entries:
                    entries[pos] = ev
        return cls(entries)


class Context:
    """Passed as the first argument to every workflow function."""

    def __init__(
        self,
        *,
        store: Store,
        claim: Claim,
        execution_id: uuid.UUID,
        deployment_id: str,
        attempt: int,
        journal: Journal | None = None,
        rng: random.Random | None = None,
        lease_valid: Callable[[], bool] | None = None,
    ) -> None:
        self._store = store
        self._claim = claim
        self._journal = journal or Journal()
        self._position = 0
        self._interrupt: str | None = None
        self._rng = rng or random.Random()
        self._lease_valid = lease_valid or (lambda: True)
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
        if self._interrupt is not None:
            raise ExecutionInterrupted(self._interrupt)

    # -- the workflow API --------------------------------------------------------------

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
        pos = self._position
        self._position += 1
        label = name or step_name(fn)
        recorded = self._journal.entries.get(pos)
        if recorded is not None:
            return self._replay(pos, label, recorded)
        policy = retry or DEFAULT_STEP_RETRY
        attempts = 0
        while True:
            attempts += 1
            try:
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
                    "pos": pos, "name": label, "attempts": attempts, "error": info,
                })
                raise StepFailed(label, info["type"], info["message"]) from exc
            self.steps_run += 1
            await self._checkpoint(STEP_COMPLETED, {
                "pos": pos, "name": label, "attempts": attempts, "result": result,
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

    def _replay(self, pos: int, label: str, recorded: HistoryEvent) -> Any:
        data = recorded.data
        recorded_name = str(data.get("name"))
        if recorded_name != label:
            raise NondeterminismError(pos, f"step {recorded_name}", f"step {label}")
        if recorded.kind == STEP_FAILED:
            err = data.get("error") or {}
            raise StepFailed(label, str(err.get("type")), str(err.get("message")))
        return data.get("result")

    async def _checkpoint(self, kind: str, data: dict[str, JSON]) -> None:
        """Write a journal event under the lease. Database trouble is retried while the
        lease can still be valid; then the run stops (ExecutionInterrupted, which workflow
        code cannot swallow): an infrastructure error is never the workflow's own error."""
        delay = 0.05
        while True:
            try:
                outcome = await self._store.execution_checkpoint_if_owned(
                    self._claim, kind, data
                )
                break
            except Exception as exc:
                if not self._lease_valid():
                    self.interrupt("checkpoint failed")
                    raise ExecutionInterrupted("checkpoint failed") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        if not outcome.applied:
            # fenced out: someone else owns the execution now; stop without writing more
            self.interrupt("lease_lost")
            raise ExecutionInterrupted("lease_lost")
