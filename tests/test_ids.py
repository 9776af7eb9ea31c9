"""Execution ids: UUIDv7 layout, strictly increasing within a process."""

from __future__ import annotations

import itertools
import uuid

from veracity._ids import new_execution_id, new_execution_ids, parse_execution_id


def test_ids_are_v7_and_strictly_increasing_even_within_a_millisecond():
    ids = [new_execution_id() for _ in range(50_000)]  # many share a millisecond
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert str(ids[0]) < str(ids[-1])  # text order (SQLite) agrees with UUID order


def test_ids_made_together_follow_each_other_and_those_made_one_by_one():
    ids = [new_execution_id()]
    for _ in range(50):
        ids += new_execution_ids(1000)  # many share a millisecond
        ids.append(new_execution_id())
    assert new_execution_ids(0) == []
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(a < b for a, b in itertools.pairwise(ids))


def test_parse():
    ident = new_execution_id()
    assert parse_execution_id(str(ident)) == ident
