"""Reading an execution's row: ``execution_from`` (a mapping of columns) and
``execution_maker`` (a tuple in a statement's column order, as PostgreSQL's store reads its
rows) set the slots of an ``Execution`` directly instead of calling its ``__init__``
(store/_ops.py says why); what they build must be exactly what ``Execution(**fields)``
builds."""

from __future__ import annotations

import dataclasses
import pickle
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from veracity.core.states import Status
from veracity.models import Execution
from veracity.store._ops import execution_from, execution_maker

T0 = datetime(2026, 12, 6, 11, 0, tzinfo=UTC)


def full_row() -> dict[str, Any]:
    """A value for every column, none of them a field's default."""
    values: dict[str, Any] = {
        "id": uuid.uuid4(), "ffqn": "shop:orders/place.fn", "params": [1, {"a": "b"}],
        "status": "running", "result": {"r": 1}, "error": {"code": "x"}, "attempt": 3,
        "deployment_id": "d1", "parent_id": uuid.uuid4(), "idempotency_key": "key-1",
        "scheduled_at": T0, "created_at": T0 - timedelta(seconds=1),
        "updated_at": T0 + timedelta(seconds=2), "lease_owner": "worker-1",
        "lease_epoch": 7, "lease_expires_at": T0 + timedelta(seconds=30),
        "history_seq": 9, "join_set": "js", "wake_at": T0 + timedelta(seconds=3),
        "signal_seq": 4, "paused_from": "pending",
        "cancel_requested_at": T0 + timedelta(seconds=4),
        "pause_requested_at": T0 + timedelta(seconds=5), "engine": "n8n",
        "external_execution_id": "ext-1", "triggered_at": T0 + timedelta(seconds=6),
        "callback_token_hash": "h", "flagged_at": T0 + timedelta(seconds=7),
        "flag_reason": "why", "flag_kind": "no_external_id",
        "end_request": {"action": "fail"}, "end_requested_at": T0 + timedelta(seconds=8),
        "retry_of": uuid.uuid4(), "started_at": T0 + timedelta(seconds=9),
    }
    assert set(values) == set(Execution.__dataclass_fields__)  # a new field needs a value
    return values


def test_a_row_reads_as_the_constructor_builds_it() -> None:
    row = full_row()
    built = execution_from(row)
    expected = Execution(**{**row, "status": Status(row["status"])})
    assert built == expected
    assert repr(built) == repr(expected)
    assert built.status is Status.RUNNING
    for name in Execution.__dataclass_fields__:
        assert getattr(built, name) == getattr(expected, name), name


def test_what_it_builds_stays_frozen_and_behaves_as_a_dataclass() -> None:
    built = execution_from(full_row())
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.status = Status.COMPLETED  # type: ignore[misc]
    changed = dataclasses.replace(built, status=Status.COMPLETED)
    assert changed.status is Status.COMPLETED and changed.id == built.id
    assert pickle.loads(pickle.dumps(built)) == built
    assert dataclasses.asdict(built)["lease_epoch"] == 7


@pytest.mark.parametrize("status", [str(s) for s in Status])
def test_every_status_reads_as_its_member(status: str) -> None:
    assert execution_from({**full_row(), "status": status}).status is Status(status)


def test_a_status_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError):
        execution_from({**full_row(), "status": "sleeping"})


def test_a_row_missing_a_column_is_refused() -> None:
    row = full_row()
    del row["started_at"]
    with pytest.raises(KeyError):
        execution_from(row)


def as_tuple(row: dict[str, Any], extra: bool = True) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The row as a statement gives it to a tuple-reading driver: its columns in an order of
    their own (here reversed), with a column of the statement's own (as the completion's
    ``ended_note``) in between."""
    items = list(reversed(row.items()))
    if extra:
        items.insert(len(items) // 2, ("ended_note", True))
    return tuple(k for k, _ in items), tuple(v for _, v in items)


def test_a_tuple_reads_as_its_mapping_does() -> None:
    row = full_row()
    columns, values = as_tuple(row)
    built = execution_maker(columns)(values)
    assert built == execution_from(row) == Execution(**{**row, "status": Status(row["status"])})
    assert repr(built) == repr(execution_from(row))
    for name in Execution.__dataclass_fields__:
        assert getattr(built, name) == row[name] or name == "status", name


@pytest.mark.parametrize("status", [str(s) for s in Status])
def test_every_status_in_a_tuple_reads_as_its_member(status: str) -> None:
    columns, values = as_tuple({**full_row(), "status": status})
    assert execution_maker(columns)(values).status is Status(status)


def test_a_tuple_whose_status_is_not_one_is_refused() -> None:
    columns, values = as_tuple({**full_row(), "status": "sleeping"})
    with pytest.raises(ValueError):
        execution_maker(columns)(values)


def test_columns_missing_one_are_refused_before_any_row() -> None:
    row = full_row()
    del row["started_at"]
    columns, _ = as_tuple(row, extra=False)
    with pytest.raises(KeyError):
        execution_maker(columns)


def test_a_maker_is_made_once_per_order_of_columns() -> None:
    columns, values = as_tuple(full_row())
    assert execution_maker(columns) is execution_maker(tuple(columns))
    assert execution_maker(columns)(values) == execution_maker(columns)(list(values))
