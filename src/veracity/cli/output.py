"""Printing: readable tables by default, JSON with --json."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click


def to_jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" if value else "-"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    line = "  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers))
    click.echo(line.rstrip())
    for row in rows:
        click.echo("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())


def fields_lines(fields: Sequence[tuple[str, str]]) -> list[str]:
    """Names and values in two columns, the names padded to the longest."""
    width = max(len(k) for k, _ in fields)
    return [f"{key.ljust(width)}  {value}" for key, value in fields]


def print_fields(fields: Sequence[tuple[str, str]]) -> None:
    for line in fields_lines(fields):
        click.echo(line)
