"""How the dashboard writes values for a person: times, ages, JSON, ids, statuses.

Pure functions, registered as Jinja2 filters by :mod:`veracity.ui.routes`.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from veracity.core.states import Status

JSON_SHOWN = 16_384
"""Characters of a JSON value the detail page shows; the rest is summed up."""

NEEDS_A_PERSON = ("failed", "failed_transient", "blocked", "paused")
"""Statuses counted at the top of the list (with flagged and stranded executions)."""

FLAG_ADVICE: dict[str, str] = {
    "no_external_id": "Veracity never learnt the engine's id for this run, so it cannot ask "
                      "whether the run exists. Look for it in the engine: attach its id if "
                      "you find it; if it never started, fail it (it ends on your word).",
    "trigger_unknown": "The trigger's answer was ambiguous (a timeout, a 5xx, no id). Look "
                       "for the run in the engine and attach its id, or fail it if it never "
                       "started.",
    "engine_unconfigured": "This server has no configuration for the run's engine: it can "
                           "neither ask nor stop it. Configure the engine, or end the run "
                           "with force once you have checked it in the engine.",
    "unknown_id": "The engine says it has no run with this id. If the engine lost it, fail "
                  "it; if the id is wrong, attach the right one. The flag clears by itself "
                  "if a later look finds the run.",
    "stop_unconfirmed": "A stop was wanted (its limit, a cancel or an operator) and the "
                        "engine has not confirmed it. Stop the run in the engine; Veracity "
                        "ends it once the engine confirms, or force the end.",
    "forced": "Ended by an operator without the engine's confirmation: check in the engine "
              "that the run really stopped.",
}
"""What the flagged page suggests for each flag kind (docs/external.md)."""

STATUS_WORDS: dict[str, str] = {
    "pending": "waiting for a worker",
    "running": "held by a worker or an engine",
    "blocked": "waiting (a sleep, a message or children)",
    "paused": "held by an operator",
    "completed": "finished with a result",
    "failed": "failed for good",
    "failed_transient": "failed; may be retried",
    "cancelled": "cancelled",
}


def when(value: datetime | None) -> str:
    """``2026-12-01 18:30:05Z``: UTC, to the second."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def span(seconds: float) -> str:
    """A duration in the largest unit that reads well: ``42 s``, ``3 min``, ``2 h 5 min``."""
    s = abs(seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        hours, rest = divmod(int(s), 3600)
        return f"{hours} h {rest // 60} min" if rest >= 60 else f"{hours} h"
    return f"{s / 86400:.0f} d"


def ago(value: datetime | None, now: datetime) -> str:
    """``5 s ago`` or ``in 3 min``."""
    if value is None:
        return ""
    delta = (now - value).total_seconds()
    return f"{span(delta)} ago" if delta >= 0 else f"in {span(delta)}"


def pretty(value: Any, limit: int = JSON_SHOWN) -> str:
    """JSON, indented, cut at ``limit`` characters with how much was left out."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    if len(text) > limit:
        return f"{text[:limit]}\n… ({len(text) - limit:,} more characters)"
    return text


def inline(value: Any, limit: int = 120) -> str:
    """JSON on one line, cut at ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short(ident: uuid.UUID | str | None) -> str:
    """The last 8 hex digits of an id (the page links to the whole one)."""
    # the last digits: an execution id is a UUIDv7, whose first ones are its creation time,
    # the same for executions made in the same millisecond or so
    return "" if ident is None else str(ident)[-8:]


def status_word(status: Status | str) -> str:
    return STATUS_WORDS.get(str(status), str(status))


def is_unfinished(status: Status | str) -> bool:
    return not Status(str(status)).is_terminal


def by_join_set(children: list[Any]) -> list[tuple[str, list[Any]]]:
    """Children grouped by join set, in the order each set first appears; direct calls
    (no join set) under ``""``."""
    groups: dict[str, list[Any]] = {}
    for c in children:
        groups.setdefault(c.join_set or "", []).append(c)
    return list(groups.items())
