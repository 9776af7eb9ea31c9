"""RetryPolicy: exponential backoff with jitter, attempt limits, non-retryable errors (pure)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from veracity.core.retry import NO_RETRY, RetryPolicy

# random_unit that puts the jitter at the middle: no spread at all
MID = 0.5
# the largest float below 1.0 (random_unit is uniform in [0, 1))
ALMOST_ONE = math.nextafter(1.0, 0.0)


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


class MorePermanent(Permanent):
    pass


def test_defaults() -> None:
    p = RetryPolicy()
    assert p.max_attempts == 6
    assert p.initial_delay == 1.0
    assert p.backoff == 2.0
    assert p.max_delay == 60.0
    # about half a minute of retrying in all, without jitter
    assert sum(p.delay(n, MID) for n in range(1, p.max_attempts)) == pytest.approx(31.0)
    assert p.jitter == 0.2
    assert p.non_retryable == ()


def test_delays_grow_exponentially_without_jitter() -> None:
    p = RetryPolicy(initial_delay=0.5, backoff=3.0, max_delay=1000.0, jitter=0.0)
    assert [p.delay(n, MID) for n in range(1, 6)] == pytest.approx(
        [0.5, 1.5, 4.5, 13.5, 40.5]
    )
    # jitter 0: the random unit does not matter
    assert p.delay(3, 0.0) == pytest.approx(4.5)
    assert p.delay(3, ALMOST_ONE) == pytest.approx(4.5)


def test_delays_cap_at_max_delay() -> None:
    p = RetryPolicy(initial_delay=1.0, backoff=2.0, max_delay=10.0, jitter=0.0)
    assert [p.delay(n, MID) for n in range(1, 8)] == pytest.approx(
        [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    )


def test_delays_are_monotonic_up_to_the_cap() -> None:
    p = RetryPolicy(initial_delay=0.01, backoff=1.7, max_delay=5.0, jitter=0.0)
    delays = [p.delay(n, MID) for n in range(1, 40)]
    assert delays == sorted(delays)
    assert max(delays) == pytest.approx(5.0)
    assert delays[0] == pytest.approx(0.01)


def test_backoff_one_is_a_constant_delay() -> None:
    p = RetryPolicy(initial_delay=0.3, backoff=1.0, jitter=0.0)
    assert {round(p.delay(n, MID), 9) for n in range(1, 20)} == {0.3}


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 10])
def test_jitter_bounds(attempt: int) -> None:
    p = RetryPolicy(initial_delay=1.0, backoff=2.0, max_delay=100.0, jitter=0.25)
    base = min(100.0, 2.0 ** (attempt - 1))
    assert p.delay(attempt, 0.0) == pytest.approx(base * 0.75)
    assert p.delay(attempt, ALMOST_ONE) == pytest.approx(base * 1.25)
    assert p.delay(attempt, MID) == pytest.approx(base)
    # everything in between stays inside [base(1-j), base(1+j)]
    for i in range(101):
        d = p.delay(attempt, i / 101)
        assert base * 0.75 - 1e-9 <= d <= base * 1.25 + 1e-9


def test_jitter_applies_after_the_cap() -> None:
    p = RetryPolicy(initial_delay=1.0, backoff=10.0, max_delay=5.0, jitter=0.5)
    assert p.delay(9, 0.0) == pytest.approx(2.5)
    assert p.delay(9, ALMOST_ONE) == pytest.approx(7.5)


def test_full_jitter_never_negative() -> None:
    p = RetryPolicy(initial_delay=2.0, jitter=1.0)
    assert p.delay(1, 0.0) == 0.0
    assert p.delay(1, ALMOST_ONE) == pytest.approx(4.0)
    assert all(p.delay(n, i / 50) >= 0.0 for n in range(1, 6) for i in range(50))


def test_zero_initial_delay_means_no_wait() -> None:
    p = RetryPolicy(initial_delay=0.0)
    assert all(p.delay(n, u) == 0.0 for n in range(1, 10) for u in (0.0, MID, ALMOST_ONE))


def test_max_attempts_counts_the_first_try() -> None:
    p = RetryPolicy(max_attempts=3)
    err = Transient("x")
    assert p.should_retry(1, err)
    assert p.should_retry(2, err)
    assert not p.should_retry(3, err)
    assert not p.should_retry(4, err)


def test_max_attempts_one_never_retries() -> None:
    p = RetryPolicy(max_attempts=1)
    assert not p.should_retry(1, Transient("x"))
    assert NO_RETRY.max_attempts == 1
    assert not NO_RETRY.should_retry(1, Transient("x"))


def test_non_retryable_fails_at_once_including_subclasses() -> None:
    p = RetryPolicy(max_attempts=10, non_retryable=(Permanent, KeyError))
    assert not p.should_retry(1, Permanent("no"))
    assert not p.should_retry(1, MorePermanent("no"))
    assert not p.should_retry(1, KeyError("k"))
    assert p.should_retry(1, Transient("yes"))
    assert p.should_retry(9, ValueError("yes"))
    assert not p.should_retry(10, ValueError("limit"))


def test_an_error_that_says_it_is_permanent_fails_at_once() -> None:
    # ctx.http's refusals (docs/http.md) carry retryable = False: asking again changes nothing
    class Refused(Exception):
        retryable = False

    class SaysRetry(Exception):
        retryable = True

    p = RetryPolicy(max_attempts=10)
    assert not p.should_retry(1, Refused("no"))
    assert p.should_retry(1, SaysRetry("yes"))
    assert p.should_retry(1, Transient("no attribute: as before"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"initial_delay": -0.1},
        {"max_delay": -1.0},
        {"backoff": 0.5},
        {"backoff": 0.0},
        {"jitter": -0.01},
        {"jitter": 1.01},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_invalid_arguments_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_long_retry_series_stays_capped() -> None:
    """A "retry for hours" policy (many attempts, capped delay) must keep answering
    max_delay: ``backoff ** (n - 1)`` overflows a float after ~1024 doublings."""
    p = RetryPolicy(max_attempts=5000, initial_delay=0.1, backoff=2.0, max_delay=60.0,
                    jitter=0.0)
    assert p.delay(1000, MID) == pytest.approx(60.0)
    assert p.delay(1025, MID) == pytest.approx(60.0)
    assert p.delay(5000, MID) == pytest.approx(60.0)


@pytest.mark.parametrize("field", ["initial_delay", "max_delay", "backoff"])
def test_nan_arguments_are_rejected(field: str) -> None:
    """NaN passes every ``<`` check; RetryPolicy(initial_delay=nan) silently waits
    max_delay, RetryPolicy(max_delay=nan) never waits."""
    kwargs: dict[str, Any] = {field: math.nan}
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_nan_jitter_is_rejected() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(jitter=math.nan)


def test_boundary_arguments_are_accepted() -> None:
    p = RetryPolicy(max_attempts=1, initial_delay=0.0, max_delay=0.0, backoff=1.0, jitter=0.0)
    assert p.delay(1, MID) == 0.0
    RetryPolicy(jitter=1.0)


def test_policy_is_immutable_and_hashable() -> None:
    p = RetryPolicy(max_attempts=4)
    with pytest.raises(AttributeError):
        p.max_attempts = 5  # type: ignore[misc]
    assert hash(p) == hash(RetryPolicy(max_attempts=4))
    assert p == RetryPolicy(max_attempts=4)


@pytest.mark.parametrize("attempts_made", [0, -3])
def test_no_delay_is_shorter_than_the_initial_one(attempts_made: int) -> None:
    """Guards the clamp of the backoff exponent in RetryPolicy.delay: called before any
    try was made (or with a nonsense count), the wait is the initial delay, never a
    fraction of it (a negative exponent)."""
    p = RetryPolicy(initial_delay=0.5, backoff=4.0, max_delay=100.0, jitter=0.0)
    assert p.delay(attempts_made, MID) == pytest.approx(0.5)
    assert p.delay(attempts_made, MID) == p.delay(1, MID)
