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
    return new_execution_ids(1)[0]


def new_execution_ids(count: int) -> list[uuid.UUID]:
    """``count`` new ids, strictly increasing and after every id made before in this
    process, with one read of random bytes and one take of the lock (a batch submission
    makes its 1,000 ids in one go)."""
    global _last
    ms = time.time_ns() // 1_000_000
    noise = os.urandom(10 * count)
    values: list[int] = []
    with _lock:
        last = _last
        for i in range(count):
            rand = int.from_bytes(noise[10 * i:10 * i + 10], "big") >> 6
            at = ms
            if (at, rand) <= last:  # same millisecond (or the clock stepped back): keep order
                at, rand = last[0], last[1] + 1
                if rand >> 74:
                    at, rand = at + 1, 0
            last = (at, rand)
            values.append((at & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand >> 62) << 64
                          | 0x2 << 62 | (rand & ((1 << 62) - 1)))
        _last = last
    return [uuid.UUID(int=value) for value in values]


def parse_execution_id(text: str) -> uuid.UUID:
    """Parse an id given by a user; raises ValueError if it is not a UUID."""
    if len(text) > 64:
        raise ValueError("execution id is too long")
    return uuid.UUID(text)
