"""The digest stored with an idempotency key is the SHA-256 of the canonical JSON of the
request body; ``digest_of`` writes that JSON out from the params' canonical JSON, and must
give exactly the digest the whole body's canonical JSON gives (digests of earlier
submissions are compared with it)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from veracity.control import canonical_json, digest_of, request_digest


def reference(ffqn: str, params: list[Any], scheduled_at: datetime | None,
              paused: bool) -> str:
    body: dict[str, Any] = {
        "ffqn": ffqn, "params": params,
        "scheduled_at": scheduled_at.astimezone(UTC).isoformat() if scheduled_at else None}
    if paused:
        body["paused"] = True
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("scheduled_at", [
    None, datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-7)))], ids=str)
@pytest.mark.parametrize(("ffqn", "params"), [
    ("shop:orders/process.run", []),
    ("shop:orders/process.run", ["o-1", 2500, 2.5, None, True]),
    ("ns:päck/ïface.fn", [{"z": 1, "a": {"y": [1, {"b": "Zoë 🎉", "a": "\"q\"\n"}]}}]),
])
def test_digest_of_is_the_digest_of_the_whole_body(
    ffqn: str, params: list[Any], scheduled_at: datetime | None, paused: bool
) -> None:
    expected = reference(ffqn, params, scheduled_at, paused)
    assert request_digest(ffqn, params, scheduled_at, paused) == expected
    assert digest_of(ffqn, canonical_json(params), scheduled_at, paused) == expected
