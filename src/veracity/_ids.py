"""Execution ids: time-ordered UUIDs (version 7 layout), so new rows land at the end of
the primary-key index and ids sort by creation time. Within one process they strictly
increase, even within one millisecond, so executions submitted together (whose
``scheduled_at`` may tie at the clock's precision) are claimed in submission order."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = (0, 0)  # (milliseconds, 74 random bits) of the newest id


def new_execution_id() -> uuid.UUID:
    global _last
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big") >> 6  # 74 bits
    with _lock:
        if (ms, rand) <= _last:  # same millisecond (or the clock stepped back): keep order
            ms, rand = _last[0], _last[1] + 1
            if rand >> 74:
                ms, rand = ms + 1, 0
        _last = (ms, rand)
    rand_a, rand_b = rand >> 62, rand & ((1 << 62) - 1)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | rand_a << 64 | 0x2 << 62 | rand_b
    return uuid.UUID(int=value)


def parse_execution_id(text: str) -> uuid.UUID:
    """Parse an id given by a user; raises ValueError if it is not a UUID."""
    if len(text) > 64:
        raise ValueError("execution id is too long")
    return uuid.UUID(text)
