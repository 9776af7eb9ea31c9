"""Shared pieces of the cron tests that run real ``veracity`` processes: a configuration
with ``[[cron]]`` entries, and database reads behind the processes' backs."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.conftest import run_async
from veracity.models import Execution, ExecutionFilter, HistoryEvent
from veracity.store import open_store

APP = "veracity.examples.shop:app"
MAIL = "shop:mail/send.run"
ORDERS = "shop:orders/process.run"


def toml_value(value: Any) -> str:
    """A TOML value for a string, number, boolean or list of them (JSON spells them the
    same way)."""
    return json.dumps(value)


def cron_toml(*entries: dict[str, Any]) -> str:
    out = []
    for entry in entries:
        out.append("[[cron]]")
        out.extend(f"{key} = {toml_value(value)}" for key, value in entry.items())
        out.append("")
    return "\n".join(out)


def write_config(folder: Path, *entries: dict[str, Any]) -> Path:
    path = folder / "veracity.toml"
    path.write_text(cron_toml(*entries))
    return path


async def _executions(url: str) -> list[tuple[Execution, list[HistoryEvent]]]:
    store = await open_store(url, pool_size=2)
    try:
        found = await store.execution_list(ExecutionFilter(), limit=1000)
        return [(e, await store.history_list(e.id)) for e in found]
    finally:
        await store.close()


def executions(url: str) -> list[tuple[Execution, list[HistoryEvent]]]:
    """Every execution (at most 1000) with its history, oldest slot first."""
    return sorted(run_async(_executions(url)), key=lambda pair: (pair[0].scheduled_at,
                                                                 pair[0].id))


def slot_of(events: list[HistoryEvent]) -> tuple[str, datetime]:
    """The cron entry and slot a ``pending`` event names."""
    cron = events[0].data["cron"]
    return cron["name"], datetime.fromisoformat(cron["slot"])
