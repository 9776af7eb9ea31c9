"""Whether a worker is live (veracity.core.deployments.is_live): not stopped, and its next
heartbeat late by at most two intervals, never longer than the lease TTL; every case."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from veracity.core.deployments import MISSED_BEATS, is_live, live_window

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=120)


def test_two_missed_beats_is_the_rule() -> None:
    assert MISSED_BEATS == 2


@pytest.mark.parametrize(("interval", "window"), [
    (None, TTL),  # a worker that did not record its interval: the lease TTL
    (0.3, timedelta(seconds=0.9)),
    (10.0, timedelta(seconds=30)),
    (30.0, timedelta(seconds=90)),  # the default: lease_ttl / 4
    (40.0, TTL),  # three intervals would pass the lease TTL: capped at it
    (100.0, TTL),
])
def test_live_window(interval: float | None, window: timedelta) -> None:
    assert live_window(interval, TTL) == window


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
def test_a_heartbeat_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        live_window(interval, TTL)


@pytest.mark.parametrize("within", [timedelta(0), timedelta(seconds=-1)])
def test_live_within_must_be_positive(within: timedelta) -> None:
    with pytest.raises(ValueError, match="positive"):
        live_window(1.0, within)


@pytest.mark.parametrize(("age", "interval", "live"), [
    (0.0, 1.0, True),
    (1.0, 1.0, True),  # the next beat is due now
    (2.9, 1.0, True),  # that beat late by 1.9 intervals
    (3.0, 1.0, True),  # late by exactly two intervals: still live
    (3.001, 1.0, False),  # by more than two
    (60.0, 1.0, False),
    (89.0, None, True),
    (120.0, None, True),
    (120.001, None, False),
    (100.0, 50.0, True),  # capped at the TTL, not three intervals (150 s)
    (121.0, 50.0, False),
    (-5.0, 1.0, True),  # a heartbeat "from the future" (another clock): live
])
def test_is_live_by_heartbeat_age(age: float, interval: float | None, live: bool) -> None:
    beat = NOW - timedelta(seconds=age)
    assert is_live(stopped_at=None, last_heartbeat=beat, heartbeat_interval=interval,
                   now=NOW, live_within=TTL) is live


@pytest.mark.parametrize("interval", [None, 1.0])
def test_a_stopped_worker_is_never_live(interval: float | None) -> None:
    assert not is_live(stopped_at=NOW, last_heartbeat=NOW, heartbeat_interval=interval,
                       now=NOW, live_within=TTL)
