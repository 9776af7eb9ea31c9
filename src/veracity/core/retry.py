"""Retry policies: exponential backoff with jitter (pure; randomness is passed in)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failing step is tried, and how long to wait in between.

    ``max_attempts`` counts the first try (1 = no retries). The n-th retry waits
    ``initial_delay * backoff ** (n - 1)`` seconds, capped at ``max_delay``, then spread by
    ``± jitter`` (a fraction) so that many failing steps do not retry in lock step.
    Exceptions of a ``non_retryable`` type fail the step at once, and so does an exception
    that says it is permanent with ``retryable = False`` (as ``ctx.http``'s refusals do).

    The defaults ride out a short outage of what a step calls: 6 tries, waiting about 1, 2,
    4, 8 and 16 s in between (about half a minute in all) before the step fails.
    """

    max_attempts: int = 6
    initial_delay: float = 1.0
    backoff: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.2
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("initial_delay", "backoff", "max_delay", "jitter"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must not be negative")
        if self.backoff < 1:
            raise ValueError("backoff must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction between 0 and 1")

    def should_retry(self, attempts_made: int, error: BaseException) -> bool:
        """After ``attempts_made`` tries that ended in ``error``, try again?"""
        if isinstance(error, self.non_retryable) or getattr(error, "retryable", True) is False:
            return False
        return attempts_made < self.max_attempts

    def delay(self, attempts_made: int, random_unit: float) -> float:
        """Seconds to wait before the next try; ``random_unit`` is uniform in [0, 1)."""
        try:
            raw = self.initial_delay * self.backoff ** max(0, attempts_made - 1)
        except OverflowError:  # a long series: the cap applies long before this
            raw = self.max_delay
        base = min(self.max_delay, raw)
        spread = base * self.jitter * (2 * random_unit - 1)
        return max(0.0, base + spread)


NO_RETRY = RetryPolicy(max_attempts=1)
"""One try only: the default for a workflow (a workflow's own error is usually a bug that
would happen again; give it a policy to retry it)."""

WORKFLOW_RETRY = "workflow retry"
"""The reason of the ``pending`` history event that starts a workflow's retry: the run after
it starts afresh, replaying nothing recorded before it (docs/workflows.md)."""
