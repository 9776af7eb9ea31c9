"""Pieces every backend shares: the late-report event and transition guards."""

from __future__ import annotations

from veracity.core.states import Status, sources_of
from veracity.models import JSON, Claim, Execution

# the states a worker's fenced write may leave: exactly those the table allows
OWNED_FROM: tuple[Status, ...] = (Status.RUNNING,)


def owned_sources(target: Status) -> list[str]:
    return [str(s) for s in sources_of(target, among=OWNED_FROM)]


def claim_sources() -> list[str]:
    return [str(s) for s in sources_of(Status.RUNNING, among=(Status.PENDING,))]


def late_report_event(
    report: str, claim: Claim, payload: JSON, current: Execution | None
) -> dict[str, JSON]:
    """What a refused fenced write leaves in history (DESIGN invariant 4)."""
    if current is None:
        reason = "execution does not exist"
    elif current.status != Status.RUNNING:
        reason = f"execution is {current.status}"
    elif current.lease_owner != claim.owner or current.lease_epoch != claim.epoch:
        reason = "lease is held by another owner or epoch"
    else:
        reason = "lease expired"
    return {
        "report": report,
        "owner": claim.owner,
        "epoch": claim.epoch,
        "payload": payload,
        "reason": reason,
    }
