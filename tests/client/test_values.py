"""``ClientExecution.of``: an execution as the API answered it, each field read by name."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import pytest

from veracity.client import ClientExecution

ANSWER: dict[str, Any] = {
    "id": "0190a2c4-1234-7abc-8def-0123456789ab", "ffqn": "shop:orders/process.run",
    "params": ["o-1", 2], "status": "failed", "result": None,
    "error": {"type": "ValueError", "message": "no"}, "attempt": 3,
    "deployment_id": "d-1", "parent_id": "0190a2c4-1234-7abc-8def-0123456789ac",
    "idempotency_key": "k-1", "scheduled_at": "2026-12-06T16:00:00.123456Z",
    "created_at": "2026-12-06T15:59:59Z", "updated_at": "2026-12-06T16:00:01+02:00",
    "waiting_reason": None, "retry_of": "0190a2c4-1234-7abc-8def-0123456789ad",
    # fields the client keeps in raw only
    "lease_owner": None, "lease_epoch": 4, "engine": None, "elided": None,
}


def test_every_field_is_read_and_times_are_parsed() -> None:
    got = ClientExecution.of(ANSWER)
    expected: dict[str, Any] = {
        f.name: ANSWER[f.name] for f in fields(ClientExecution) if f.name != "raw"}
    expected["scheduled_at"] = datetime(2026, 12, 6, 16, 0, 0, 123456, tzinfo=UTC)
    expected["created_at"] = datetime(2026, 12, 6, 15, 59, 59, tzinfo=UTC)
    expected["updated_at"] = datetime.fromisoformat("2026-12-06T16:00:01+02:00")
    assert {f.name: getattr(got, f.name) for f in fields(got) if f.name != "raw"} == expected
    assert got.raw == ANSWER and got.raw is not ANSWER  # a copy: the caller's stays theirs
    assert got.terminal


def test_fields_the_answer_leaves_out_take_their_defaults() -> None:
    got = ClientExecution.of({"id": "x", "ffqn": "a:b/c.d", "status": "pending"})
    assert got == ClientExecution(id="x", ffqn="a:b/c.d", status="pending")
    assert (got.attempt, got.deployment_id, got.params, got.created_at) == (1, "", None, None)


@pytest.mark.parametrize("missing", ["id", "ffqn", "status"])
def test_an_answer_without_an_identity_is_refused(missing: str) -> None:
    with pytest.raises(KeyError, match=missing):
        ClientExecution.of({k: v for k, v in ANSWER.items() if k != missing})
