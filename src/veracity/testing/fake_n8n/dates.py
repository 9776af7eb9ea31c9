"""Dates in the fake: n8n's JSON form (:func:`iso`), the ground truth's full-precision form
(:func:`iso_full`), parsing, and the rule that every time the fake takes is
timezone-aware.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso(value: datetime | None) -> str | None:
    """n8n's JSON date form: ``2026-04-11T03:34:58.155Z``."""
    if value is None:
        return None
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return value


def iso_full(value: datetime | None) -> str | None:
    """Full-precision ISO 8601 (ground truth keeps microseconds)."""
    return None if value is None else value.astimezone(UTC).isoformat()


def _require_aware(when: datetime) -> None:
    if when.tzinfo is None:
        raise ValueError("times must be timezone-aware")
