"""Loading SQL: named queries from ``queries.sql`` and numbered migrations.

A queries file is split on ``-- name: query_name`` headers; no SQL lives in Python code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{package}/{filename}: query {name!r} defined twice")
        queries[name] = body.strip().rstrip(";")
    return queries


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(package: str) -> list[Migration]:
    folder = resources.files(package).joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        m = _MIGRATION.match(entry.name)
        if m:
            found.append(
                Migration(int(m["version"]), m["name"], entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"{package}: migrations must be numbered 1..n without gaps: {versions}")
    return found
