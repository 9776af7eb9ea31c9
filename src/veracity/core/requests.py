"""What can be asked of an execution from outside its worker, and the answers.

Plain values with no I/O, shared by the store, the worker and the control plane, so that a
kind is never a bare string that a typo could change (docs/workflows.md for cancel and
pause, docs/external.md for callbacks and resolutions).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CallbackOutcome", "CallbackReport", "InterruptKind", "ResolveAction"]


class InterruptKind(StrEnum):
    """A request a running execution's owner must act on at the next step boundary."""

    CANCEL = "cancel"
    PAUSE = "pause"


class CallbackReport(StrEnum):
    """An external engine's report on a run: ``/complete`` or ``/fail``."""

    COMPLETE = "complete"
    FAIL = "fail"


class CallbackOutcome(StrEnum):
    """What a callback did."""

    APPLIED = "applied"
    """The execution ended as reported."""
    REPEAT = "repeat"
    """The same report again: nothing changes."""
    CONFLICT = "conflict"
    """The execution had ended otherwise: the report is kept as a late report."""
    UNAUTHORIZED = "unauthorized"
    """Not this execution's callback token: nothing changes."""
    NOT_FOUND = "not_found"


class ResolveAction(StrEnum):
    """An operator's resolution of a delegated run."""

    ATTACH = "attach"
    FAIL = "fail"
    CANCEL = "cancel"
