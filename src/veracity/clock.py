"""Time, injected.

Every store query takes its notion of "now" from a :class:`Clock`. In production the
clock answers ``None``, and the SQL falls back to the database's own clock
(``coalesce(%(now)s, now())``), so leases never depend on a worker's local time. Tests
use :class:`ManualClock` to make time stand still or jump.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime | None:
        """The time to use, or ``None`` to let the database decide."""


class DatabaseClock:
    """Production clock: defer to the database's ``now()``."""

    def now(self) -> datetime | None:
        return None


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def set(self, when: datetime) -> None:
        self._now = when

    def advance(self, delta: timedelta | float) -> datetime:
        self._now += delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        return self._now
