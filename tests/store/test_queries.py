"""The SQL seam: every named query an operation written once for both backends uses
(``veracity.store._ops``) exists in both backends' queries.sql, and every name a backend
looks up directly exists in its own file. Needs no database."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from veracity.store._sql import load_queries

STORE = Path(__file__).resolve().parents[2] / "src" / "veracity" / "store"
BACKENDS = {"postgres": "veracity.store.postgres", "sqlite": "veracity.store.sqlite"}


def shared_query_names() -> set[str]:
    """Names passed as ``Query("name", ...)`` in the shared operations."""
    tree = ast.parse((STORE / "_ops.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "Query" and node.args
                and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value))
    return names


def test_the_shared_operations_use_named_queries() -> None:
    names = shared_query_names()
    assert len(names) > 30  # the scan finds them (it would find none if Query were renamed)
    assert {"execution_lock", "execution_recover_many", "history_append_many"} <= names


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_shared_query_exists_in_each_backend(backend: str) -> None:
    queries = load_queries(BACKENDS[backend])
    missing = sorted(shared_query_names() - set(queries))
    assert missing == [], f"{backend}/queries.sql lacks {missing}"


@pytest.mark.parametrize(("backend", "pattern"), [
    ("postgres", r'_q\(\s*"([a-z_]+)"'),
    ("postgres", r'_fetch(?:all|one)\(\s*"([a-z_]+)"'),
    ("sqlite", r'Q\["([a-z_]+)"\]'),
    ("sqlite", r'self._all,\s*"([a-z_]+)"'),
])
def test_every_query_a_backend_names_exists_in_its_file(backend: str, pattern: str) -> None:
    source = (STORE / backend / "store.py").read_text()
    used = set(re.findall(pattern, source)) - set(DERIVED.get(backend, {}))
    assert used, f"no query names found in {backend}/store.py with {pattern!r}"
    missing = sorted(used - set(load_queries(BACKENDS[backend])))
    assert missing == [], f"{backend}/store.py names queries its file lacks: {missing}"


# Queries a backend derives from one of its file's at import (each raising if the text it
# rewrites has changed): the derived one and the one it comes from
DERIVED = {"postgres": {"execution_leave_many_brief": "execution_leave_many_if_owned",
                        "execution_list_prefix_names": "execution_list_by_ffqn"}}


def test_a_prefix_s_names_are_counted_as_its_page_finds_them() -> None:
    """execution_list_prefix_names is execution_list_by_ffqn's `names`, counted."""
    from veracity.store.postgres.store import Q

    count, page = Q["execution_list_prefix_names"], Q["execution_list_by_ffqn"]
    names, _, counted = count.rpartition("\n)\n")
    assert names.startswith("WITH RECURSIVE names (ffqn) AS (") and names in page
    assert counted.startswith("SELECT count(*) AS n FROM (SELECT 1 FROM names")


def test_the_brief_exits_differ_from_their_query_in_the_columns_answered_only() -> None:
    from veracity.store.postgres.store import Q

    whole, brief = Q["execution_leave_many_if_owned"], Q["execution_leave_many_brief"]
    head, tail = whole.rsplit("SELECT *,", 1)
    assert brief == f"{head}SELECT id, ffqn, status, started_at, updated_at,{tail}"
