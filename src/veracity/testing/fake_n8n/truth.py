"""Ground truth and records: each run's :class:`Transition` list, its stop requests
(:class:`StopRecord`), every callback attempt (:class:`CallbackAttempt`), and
:class:`RunTruth`, the snapshot that says whether a run was still going at a given time, which
is what :meth:`FakeN8n.truthful_violations` checks Veracity's terminal times against.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from veracity.testing.fake_n8n.dates import _require_aware, iso, iso_full


@dataclass(frozen=True)
class Transition:
    """One observable change of a run (or a ground-truth event), with its API fields after it."""

    event: str
    at: datetime
    monotonic: float
    status: str
    stopped_at: datetime | None
    wait_till: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "at": iso_full(self.at),
            "monotonic": self.monotonic,
            "status": self.status,
            "stoppedAt": iso(self.stopped_at),
            "waitTill": iso(self.wait_till),
        }


@dataclass(frozen=True)
class StopRecord:
    """A stop request and what the fake did: stopped, ignored, failed or refused."""

    at: datetime
    monotonic: float
    via: str
    outcome: str

    def to_json(self) -> dict[str, Any]:
        return {
            "at": iso_full(self.at),
            "monotonic": self.monotonic,
            "via": self.via,
            "outcome": self.outcome,
        }


@dataclass(frozen=True)
class CallbackAttempt:
    """One HTTP call of a callback URL and its answer (status, or the transport error)."""

    run_id: str
    execution_id: str | None
    kind: Literal["complete", "fail"]
    url: str
    body: Any
    attempt: int
    at: datetime
    status_code: int | None
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "execution_id": self.execution_id,
            "kind": self.kind,
            "url": self.url,
            "body": self.body,
            "attempt": self.attempt,
            "at": iso_full(self.at),
            "status_code": self.status_code,
            "error": self.error,
        }


@dataclass(frozen=True)
class RunTruth:
    """A snapshot of one run: what really happened, and what the API shows now."""

    run_id: str
    execution_id: str | None
    path: str
    workflow_id: str
    status: str
    forgotten: bool
    started_at: datetime
    started_monotonic: float
    stopped_at: datetime | None
    stopped_monotonic: float | None
    end: str | None
    transitions: tuple[Transition, ...]
    stop_requests: tuple[StopRecord, ...]
    trigger_body: Any

    @property
    def going(self) -> bool:
        return self.stopped_at is None

    def is_going_at(self, when: datetime) -> bool:
        """Whether the run had started and had not yet really stopped at ``when``."""
        _require_aware(when)
        if when < self.started_at:
            return False
        return self.stopped_at is None or when < self.stopped_at

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "execution_id": self.execution_id,
            "path": self.path,
            "workflow_id": self.workflow_id,
            "status": self.status,
            "forgotten": self.forgotten,
            "going": self.going,
            "started_at": iso_full(self.started_at),
            "started_monotonic": self.started_monotonic,
            "stopped_at": iso_full(self.stopped_at),
            "stopped_monotonic": self.stopped_monotonic,
            "end": self.end,
            "transitions": [t.to_json() for t in self.transitions],
            "stop_requests": [s.to_json() for s in self.stop_requests],
        }
