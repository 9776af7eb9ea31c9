"""The one store protocol that every backend implements.

Methods are named entity first (``execution_claim``, ``execution_complete_if_owned``).
Every state change is a single guarded statement whose WHERE clause names the states it
may leave (taken from :data:`veracity.core.states.TRANSITIONS`) plus its history event,
in one transaction. Zero rows changed is an answer (``TransitionResult.applied=False``),
never an exception. The conformance suite in ``tests/store/`` runs against every backend.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from veracity.models import (
    JSON,
    Claim,
    Execution,
    ExecutionFilter,
    HistoryEvent,
    ListCursor,
    NewExecution,
    Submitted,
    TransitionResult,
)


class Store(Protocol):
    backend: str
    """``"postgresql"`` or ``"sqlite"``."""

    async def migrate(self) -> list[int]:
        """Apply pending migrations (safe from several processes at once); return the
        versions this call applied."""

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise if the database does not answer."""

    # -- executions -----------------------------------------------------------------

    async def execution_submit(self, new: NewExecution) -> Submitted:
        """Insert a pending execution and its ``pending`` history event.

        With an idempotency key that already exists, insert nothing and return the
        existing execution with ``created=False`` (concurrent calls create one row).
        """

    async def execution_get(self, execution_id: uuid.UUID) -> Execution | None: ...

    async def execution_list(
        self, filter: ExecutionFilter, *, limit: int, after: ListCursor | None = None
    ) -> list[Execution]:
        """Newest first (created_at, id descending), keyset-paginated by ``after``."""

    async def history_list(
        self, execution_id: uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryEvent]:
        """History events in order of ``seq``."""

    # -- leases (fenced writes) ---------------------------------------------------------

    async def execution_claim(
        self, owner: str, ffqns: Sequence[str], *, limit: int, lease_ttl: timedelta
    ) -> list[Execution]:
        """Claim up to ``limit`` due pending executions of the given workflows: set
        running, owner, a new lease_epoch and lease_expires_at from the store's clock.
        Concurrent claimers never receive the same execution."""

    async def execution_complete_if_owned(self, claim: Claim, result: JSON) -> TransitionResult:
        """running -> completed, only while ``claim`` still holds an unexpired lease.
        A refused write is appended to history as a ``late_report``."""

    async def execution_fail_if_owned(
        self, claim: Claim, error: JSON, *, transient: bool = False
    ) -> TransitionResult:
        """running -> failed (or failed_transient), guarded like completion."""

    async def execution_release_if_owned(self, claim: Claim, reason: str) -> TransitionResult:
        """running -> pending (the lease is given back), guarded like completion."""
