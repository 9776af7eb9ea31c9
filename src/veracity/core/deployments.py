"""Which unfinished executions the live workers will run, and which are stranded
(docs/deployments.md). Pure decisions, no I/O: the control plane's ``waiting_reason`` and
the store's deployments listing both ask :class:`Coverage`.

A worker claims the executions of its own deployment, and, for a workflow registered with
``upgrade="auto"``, those of every deployment. An unfinished execution whose deployment has
no live worker, and whose workflow no live worker claims from every deployment, is
*stranded*: nothing will ever run it until an operator adopts it onto a deployment that
runs. A run delegated to an external engine needs no worker (the engine finishes it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from veracity.core.states import Status


class Upgrade(StrEnum):
    """How a workflow's executions follow a new deployment (``@app.workflow(upgrade=)``)."""

    PINNED = "pinned"
    """Run only by workers of the deployment it belongs to (the default)."""
    AUTO = "auto"
    """Claimed by a worker of any deployment, and moved onto that worker's deployment."""


MISSED_BEATS = 2
"""A worker whose next heartbeat is late by more than this many heartbeat intervals is
not live (killed, frozen, cut off), long before its leases expire."""


def live_window(heartbeat_interval: float | None, live_within: timedelta) -> timedelta:
    """How old a worker's last heartbeat may be while it counts as live: its next beat
    (one interval after the last) missed by at most ``MISSED_BEATS`` more intervals, and
    never longer than ``live_within`` (the lease TTL). A worker that did not record its
    heartbeat interval (one started before it was recorded) has ``live_within``."""
    if live_within <= timedelta(0):
        raise ValueError("live_within must be positive")
    if heartbeat_interval is None:
        return live_within
    if not heartbeat_interval > 0:
        raise ValueError("a heartbeat interval must be positive")
    beats = timedelta(seconds=heartbeat_interval * (MISSED_BEATS + 1))
    return min(beats, live_within)


def is_live(*, stopped_at: datetime | None, last_heartbeat: datetime,
            heartbeat_interval: float | None, now: datetime, live_within: timedelta) -> bool:
    """Not stopped, and its last heartbeat within :func:`live_window` of ``now`` (the
    database's clock, as the heartbeat's)."""
    if stopped_at is not None:
        return False
    return now - last_heartbeat <= live_window(heartbeat_interval, live_within)


@dataclass(frozen=True, slots=True)
class LiveWorker:
    """What a live worker (:func:`is_live`) registered."""

    deployment_id: str
    ffqns: frozenset[str]
    upgrade_ffqns: frozenset[str]


class Coverage:
    """What the live workers will run."""

    def __init__(self, live: Iterable[LiveWorker]) -> None:
        self.workers: Counter[str] = Counter()
        self.runs: set[str] = set()
        self.runs_in: dict[str, set[str]] = {}
        self.upgrades: set[str] = set()
        for w in live:
            self.workers[w.deployment_id] += 1
            self.runs |= w.ffqns
            self.runs_in.setdefault(w.deployment_id, set()).update(w.ffqns)
            self.upgrades |= w.upgrade_ffqns & w.ffqns

    def live_workers(self, deployment_id: str) -> int:
        return self.workers[deployment_id]

    def stranded(self, *, status: Status, ffqn: str, deployment_id: str,
                 delegated: bool) -> bool:
        """Unfinished, needing a worker, and no live worker will claim it: none of its
        deployment is live, and none claims its workflow from every deployment."""
        if status.is_terminal or delegated:
            return False
        return self.workers[deployment_id] == 0 and ffqn not in self.upgrades

    def waiting_reason(self, *, status: Status, ffqn: str, deployment_id: str,
                       delegated: bool) -> str | None:
        """Why no worker runs it, if none will: its workflow is registered by no live
        worker (a pending one), its deployment has no live worker (stranded), or its
        deployment's live workers do not register its workflow (a pending one)."""
        if status.is_terminal or delegated:
            return None
        pending = status == Status.PENDING
        if pending and ffqn not in self.runs:
            return f"no live worker runs {ffqn}"
        if self.stranded(status=status, ffqn=ffqn, deployment_id=deployment_id,
                         delegated=delegated):
            return f"no live worker for deployment {deployment_id}"
        if pending and ffqn not in self.upgrades \
                and ffqn not in self.runs_in.get(deployment_id, ()):
            return f"no live worker of deployment {deployment_id} runs {ffqn}"
        return None
