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

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from veracity.core.states import Status

__all__ = ["Expired", "RecoveryAction", "RecoveryDecision", "Registered", "decide_recovery",
           "gone_workers"]


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


@dataclass(frozen=True, slots=True)
class Registered:
    """What the recovery needs of a registered worker to judge it gone."""

    id: str
    pid: int
    host_key: str | None
    stopped: bool


def gone_workers(workers: Iterable[Registered], host_key: str | None, own_pid: int,
                 pid_gone: Callable[[int], bool]) -> list[Registered]:
    """The workers whose process is gone (docs/workers.md, "A worker whose process is
    gone"): registered with this process's ``host_key`` (same host, boot and pid namespace:
    their pid can be asked about here), not stopped, not this process, and whose pid
    ``pid_gone`` says no longer runs. No key here: none (leases decide)."""
    if host_key is None:
        return []
    return [w for w in workers
            if w.host_key == host_key and not w.stopped and w.pid != own_pid
            and pid_gone(w.pid)]
