"""Lease recovery's decision: what becomes of an execution whose worker's lease expired.

A worker that stops renewing its leases (killed, frozen, cut off from the database) leaves
its executions ``running`` under an expired lease. Lease recovery (docs/workers.md) takes
each one and decides here, from what the execution record says:

=================  ===================  ===============================================
cancel requested   attempt              becomes
=================  ===================  ===============================================
yes                any                  ``cancelled`` — or ``blocked`` while children it
                                        may not cancel are still unfinished (the last
                                        one to end records it cancelled)
no                 < max_attempts       ``pending``, attempt + 1: it runs again and
                                        resumes from its checkpoints
no                 >= max_attempts      ``failed_transient`` (``lease_expired``)
=================  ===================  ===============================================

Recovery never produces ``completed``: only the owner, with the result, may. The store
applies the decision only while the lease it looked at is still the expired one (same
owner and epoch), in the same transaction as its history event. This module does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from veracity.core.states import Status

__all__ = ["Expired", "RecoveryAction", "RecoveryDecision", "decide_recovery"]


class RecoveryAction(StrEnum):
    """What recovery does (also the label of ``veracity_recovery_actions_total``)."""

    RETRY = "retry"
    FAILED_TRANSIENT = "failed_transient"
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class Expired:
    """What recovery knows about one execution whose lease expired."""

    owner: str
    attempt: int
    max_attempts: int
    cancel_requested: bool
    open_children: int
    """Unfinished children (a cancelled parent waits for those it may not cancel)."""


@dataclass(frozen=True, slots=True)
class RecoveryDecision:
    action: RecoveryAction
    status: Status
    attempt: int
    error: dict[str, Any] | None
    """The error recorded (giving up), else None (the execution's error is kept)."""


def decide_recovery(e: Expired) -> RecoveryDecision:
    """The table in the module docstring."""
    if e.max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if e.cancel_requested:
        status = Status.BLOCKED if e.open_children > 0 else Status.CANCELLED
        return RecoveryDecision(RecoveryAction.CANCEL, status, e.attempt, None)
    if e.attempt >= e.max_attempts:
        return RecoveryDecision(
            RecoveryAction.FAILED_TRANSIENT, Status.FAILED_TRANSIENT, e.attempt,
            {"code": "lease_expired",
             "message": f"lease of {e.owner} expired on attempt {e.attempt} of "
                        f"{e.max_attempts}"})
    return RecoveryDecision(RecoveryAction.RETRY, Status.PENDING, e.attempt + 1, None)
