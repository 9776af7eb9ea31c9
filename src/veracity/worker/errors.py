"""The exceptions a workflow run raises: into workflow code (StepFailed, ChildFailed,
JoinSetEmpty, InvalidParams, NotJSONError, NondeterminismError), and past it to the worker
(ExecutionInterrupted, ExecutionSuspended, HistoryEnd: BaseExceptions, so that
``except Exception`` in workflow code cannot swallow them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from veracity.worker.journal import ChildOutcome


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


class HistoryEnd(BaseException):
    """Raised in a replay from a history alone (no store) where the run goes beyond what
    the history holds: at a call it does not record (``waiting`` False), or at a recorded
    call whose outcome it does not hold yet: a sleep not over, a receive with no message
    (``waiting`` True). Nothing is run or written: the replay stops there."""

    def __init__(self, position: int, call: str, *, waiting: bool = False) -> None:
        super().__init__(f"the history ends at position {position} ({call})")
        self.position = position
        self.call = call
        self.waiting = waiting


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


class InvalidParams(TypeError):
    """``ctx.call``, ``js.submit`` or ``ctx.schedule`` of a workflow registered in this
    worker, with params that do not fit its signature (too few, too many, or a
    keyword-only parameter without a default). Raised before anything is recorded or
    written: no execution is created and the call takes no place in the history. A call
    already recorded replays as recorded, unchecked (docs/workflows.md)."""

    def __init__(self, call: str, ffqn: str, problem: str) -> None:
        super().__init__(f"{call}: {problem}")
        self.call = call
        """The call, e.g. ``ctx.call('shop:orders/charge.run', ...)``."""
        self.ffqn = ffqn
        self.problem = problem
        """What is wrong with the params (as the submission API says it)."""


class NondeterminismError(Exception):
    """On replay, the workflow made a different call than the one recorded at a position,
    or finished while its history holds calls it never made (``unreached``)."""

    def __init__(self, position: int, recorded: str, new: str, *,
                 unreached: tuple[tuple[int, str], ...] = ()) -> None:
        if unreached:
            message = ("the workflow finished but its history holds calls this code never "
                       f"made: {recorded}")
        else:
            message = (f"nondeterminism at position {position}: the history has {recorded}, "
                       f"but the workflow now calls {new}")
        super().__init__(message)
        self.position = position
        self.recorded = recorded
        self.new = new
        self.unreached = unreached
        """(position, call) of each recorded call the finished run never reached."""

    @classmethod
    def unreached_calls(cls, calls: list[tuple[int, str]], *,
                        shown: int = 10) -> NondeterminismError:
        """The run ended with recorded calls left over (``calls``: position and call, in
        order). The message names the first ``shown`` of them."""
        named = ", ".join(f"{call} at position {pos}" for pos, call in calls[:shown])
        if len(calls) > shown:
            named += f", and {len(calls) - shown} more"
        return cls(calls[0][0], named, "no further call (the workflow finished)",
                   unreached=tuple(calls))


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
