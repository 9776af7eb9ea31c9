"""Execution ids: UUIDv7 layout, strictly increasing within a process."""

from __future__ import annotations

import itertools
import uuid

from veracity._ids import new_execution_id, parse_execution_id


def test_ids_are_v7_and_strictly_increasing_even_within_a_millisecond():
    ids = [new_execution_id() for _ in range(50_000)]  # many share a millisecond
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert str(ids[0]) < str(ids[-1])  # text order (SQLite) agrees with UUID order


def test_parse():
    ident = new_execution_id()
    assert parse_execution_id(str(ident)) == ident
