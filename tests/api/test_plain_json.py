"""A batch answers its executions through ``ExecutionOut.plain`` and
``pydantic_core.to_json`` (no model per item): the JSON must be exactly the model's."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic_core import to_json

from veracity.api.schemas import ExecutionOut
from veracity.core.states import Status
from veracity.models import Execution

AT = datetime(2026, 12, 1, 18, 5, 7, 123456, tzinfo=UTC)
BASE = Execution(
    id=uuid.uuid4(), ffqn="shop:orders/process.run", params=["o", 1, 2.5, 2**70, None],
    status=Status.PENDING, result=None, error=None, attempt=1, deployment_id="d",
    parent_id=None, idempotency_key=None, scheduled_at=AT, created_at=AT, updated_at=AT,
    lease_owner=None, lease_epoch=0, lease_expires_at=None, history_seq=1)


@pytest.mark.parametrize("execution", [
    BASE,
    dataclasses.replace(BASE, created_at=AT.replace(microsecond=0), status=Status.RUNNING,
                        lease_owner="w", lease_epoch=3, lease_expires_at=AT + timedelta(1)),
    dataclasses.replace(BASE, status=Status.COMPLETED, result={"z": [1, {"a": "ü 🎉"}]},
                        parent_id=uuid.uuid4(), idempotency_key="k", retry_of=uuid.uuid4()),
    dataclasses.replace(BASE, status=Status.FAILED, error="boom", engine="n8n",
                        external_execution_id="x", flagged_at=AT, flag_reason="r",
                        flag_kind="forced", end_request={"action": "cancel"},
                        end_requested_at=AT, wake_at=AT, cancel_requested_at=AT,
                        pause_requested_at=AT, triggered_at=AT),
], ids=["pending", "running", "completed", "failed-delegated"])
def test_plain_json_is_the_models_json(execution: Execution) -> None:
    model = ExecutionOut.of(execution).model_dump_json()
    plain = to_json(ExecutionOut.plain(execution)).decode()
    assert json.loads(plain) == json.loads(model)
    assert plain == model  # the same text, key order included


def test_json_many_is_to_json_of_each_plain_item() -> None:
    """The batch route's text of each execution: exactly the plain dict's to_json, here
    with repeated and differing values (times in other offsets for one instant, keys
    that need escaping, big and float numbers, non-ASCII text)."""
    elsewhere = AT.astimezone(timezone(timedelta(hours=2)))
    executions = [
        BASE,
        dataclasses.replace(BASE, id=uuid.uuid4(), scheduled_at=elsewhere,
                            idempotency_key='k "quoted" \\ \n ü', params=[{"z": 1.5e300}]),
        dataclasses.replace(BASE, id=uuid.uuid4(), created_at=AT.replace(microsecond=0),
                            status=Status.PAUSED, deployment_id="d-2", attempt=3),
        dataclasses.replace(BASE, status=Status.COMPLETED, result={"z": [1, {"a": "🎉"}]},
                            parent_id=uuid.uuid4(), retry_of=uuid.uuid4(), lease_epoch=7,
                            started_at=elsewhere, error=None, end_request={"a": True}),
    ]
    texts = ExecutionOut.json_many(executions)
    assert texts == [to_json(ExecutionOut.plain(e)).decode() for e in executions]
    assert texts[1] != texts[0].replace(str(BASE.id), str(executions[1].id))
    assert '"scheduled_at":"2026-12-01T20:05:07.123456+02:00"' in texts[1]


TOUCHED: dict[str, Any] = {
    "lease_owner": "w", "lease_epoch": 2, "lease_expires_at": AT, "wake_at": AT,
    "cancel_requested_at": AT, "pause_requested_at": AT, "engine": "n8n",
    "external_execution_id": "x", "triggered_at": AT, "flagged_at": AT, "flag_reason": "r",
    "flag_kind": "forced", "end_request": {"action": "fail"}, "end_requested_at": AT,
    "retry_of": uuid.uuid4(), "started_at": AT,
}


@pytest.mark.parametrize("field", sorted(TOUCHED))
def test_json_many_writes_each_later_field_that_is_set(field: str) -> None:
    """json_many writes the fields after updated_at of a row no one has touched yet as one
    constant text; an execution with any one of them set (each in turn) is written field by
    field, and both are exactly to_json of the plain dict."""
    untouched = dataclasses.replace(BASE, id=uuid.uuid4())
    touched = dataclasses.replace(BASE, id=uuid.uuid4(), **{field: TOUCHED[field]})
    texts = ExecutionOut.json_many([untouched, touched])
    assert texts == [to_json(ExecutionOut.plain(e)).decode() for e in (untouched, touched)]
    assert f'"{field}":null' not in texts[1]
