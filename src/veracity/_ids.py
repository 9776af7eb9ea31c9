"""Execution ids: time-ordered UUIDs (version 7 layout), so new rows land at the end of
the primary-key index and ids sort roughly by creation time."""

from __future__ import annotations

import os
import time
import uuid


def new_execution_id() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | rand
    # version 7 and the RFC 4122 variant
    value = (value & ~(0xF << 76)) | (0x7 << 76)
    value = (value & ~(0x3 << 62)) | (0x2 << 62)
    return uuid.UUID(int=value)


def parse_execution_id(text: str) -> uuid.UUID:
    """Parse an id given by a user; raises ValueError if it is not a UUID."""
    if len(text) > 64:
        raise ValueError("execution id is too long")
    return uuid.UUID(text)
