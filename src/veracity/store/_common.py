"""Pieces every backend shares: the late-report event and transition guards."""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from veracity.core.states import Status, sources_of
from veracity.models import JSON, Claim, Execution, ExecutionFilter, NewExecution

# orjson reads an integer beyond 64 bits as a float: a run of 19 digits or more goes to the
# standard library, which keeps it an int
_LONG_DIGITS_B = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_S = re.compile(r"[0-9]{19}")


def read_json(data: bytes | str) -> Any:
    """A stored JSON value, read back: orjson, several times faster than the standard
    library on every row a worker claims and completes, for what it reads exactly as the
    standard library does. Long digit runs (orjson turns an integer beyond 64 bits into a
    float) and whatever orjson refuses (a number too large for a float, NaN, a lone
    surrogate) are read by the standard library, so every value reads back as before."""
    long_digits = (_LONG_DIGITS_B.search(data) if isinstance(data, bytes)
                   else _LONG_DIGITS_S.search(data))
    if long_digits is None:
        try:
            return orjson.loads(data)
        except ValueError:  # orjson.JSONDecodeError, or a str it cannot encode
            pass
    return json.loads(data)


_ENCODE = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ",
    False, False, True) if json.encoder.c_make_encoder is not None else None  # type: ignore[attr-defined]


def json_text(value: Any) -> str:
    """``json.dumps(value)``, the same text, for the JSON a batch of a worker's writes
    carries (a completion's result and event, a checkpoint's data) and what psycopg's
    ``Json()`` writes on PostgreSQL, at a third of its cost for small values: the standard
    library's C encoder made once with ``json.dumps``'s defaults, instead of on every call.
    One difference: a value that contains itself raises ``RecursionError`` instead of
    ``ValueError`` (no write carries one: results and step values have been through a JSON
    round trip already)."""
    if _ENCODE is None:  # pragma: no cover - CPython always has the C encoder
        return json.dumps(value)
    return "".join(_ENCODE(value, 0))


# the states a worker's fenced write may leave: exactly those the table allows
OWNED_FROM: tuple[Status, ...] = (Status.RUNNING,)


def owned_sources(target: Status) -> list[str]:
    return list(_owned_sources(target))


@functools.cache
def _owned_sources(target: Status) -> tuple[str, ...]:
    # asked for every fenced write (twice per execution): the table does not change
    return tuple(str(s) for s in sources_of(target, among=OWNED_FROM))


def claim_sources() -> list[str]:
    return list(_claim_sources())


@functools.cache
def _claim_sources() -> tuple[str, ...]:
    return tuple(str(s) for s in sources_of(Status.RUNNING, among=(Status.PENDING,)))


def claim_split(ffqns: Sequence[str], deployment_id: str | None,
                upgrade_ffqns: Sequence[str]) -> tuple[list[str], list[str]]:
    """The workflows a claim takes from ``deployment_id`` only, and those it takes from
    every deployment (``upgrade_ffqns``; every workflow when ``deployment_id`` is None)."""
    if deployment_id is None:
        return [], sorted(set(ffqns))
    unknown = set(upgrade_ffqns) - set(ffqns)
    if unknown:
        raise ValueError(f"upgrade_ffqns must be among ffqns: {sorted(unknown)}")
    upgrading = set(upgrade_ffqns)
    return sorted(set(ffqns) - upgrading), sorted(upgrading)


REPEATED_IN_BATCH = "a second write for this execution in one batch (only the first applies)"


@dataclass(frozen=True, slots=True)
class Leave:
    """One fenced exit from running (complete, fail, release), as a batch item."""

    claim: Claim
    to: Status
    report: str
    """What the late report says was refused (``complete``, ``fail``, ``release``)."""
    event: dict[str, JSON]
    payload: JSON
    """What the late report keeps."""
    result: JSON = None
    error: JSON = None
    retry_in: float | None = None
    """For a workflow retry (to pending): claimable again only this many seconds later."""


def leave_batch(owner: str, items: Sequence[Leave]) -> list[Leave]:
    """The items to write: each execution's first (a repeat is refused as a late report),
    all of ``owner``'s."""
    if any(item.claim.owner != owner for item in items):
        raise ValueError("every claim of a batch must belong to its owner")
    first: dict[uuid.UUID, Leave] = {}
    for item in items:
        owned_sources(item.to)  # a transition the table forbids is refused before writing
        first.setdefault(item.claim.execution_id, item)
    return list(first.values())


def late_report_event(
    report: str, claim: Claim, payload: JSON, current: Execution | None,
    reason: str | None = None,
) -> dict[str, JSON]:
    """What a refused fenced write leaves in history (docs/states.md, guarantee 4); ``reason``
    when the caller knows better than the row's state why it was refused."""
    if reason is None:
        if current is None:
            reason = "execution does not exist"
        elif current.status != Status.RUNNING:
            reason = f"execution is {current.status}"
        elif current.lease_owner != claim.owner or current.lease_epoch != claim.epoch:
            reason = "lease is held by another owner or epoch"
        else:
            reason = "lease expired"
    return {
        "report": report,
        "owner": claim.owner,
        "epoch": claim.epoch,
        "payload": payload,
        "reason": reason,
    }


RESERVED_KINDS = frozenset({*(str(s) for s in Status), "late_report"})


def check_journal_kind(kind: str) -> None:
    """A checkpoint's kind names what happened; state names are reserved for state changes."""
    if kind in RESERVED_KINDS or not 1 <= len(kind) <= 64:
        raise ValueError(f"{kind!r} cannot be a journal event kind")


def require_aware(*values: datetime | None) -> None:
    """Stores keep only timezone-aware times; a naive one is a caller's bug."""
    for value in values:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: Veracity stores only timezone-aware times")


def check_new(new: NewExecution) -> None:
    require_aware(new.scheduled_at)


LIST_STATUSES: list[str] = sorted(str(s) for s in Status)
"""Every status, in the order a list page without a status filter reads them one at a time
(each backend's list by a workflow name or a deployment, keyed on the status too)."""


def check_filter(filter: ExecutionFilter) -> None:
    require_aware(filter.created_after, filter.created_before)


def recover_sources() -> list[str]:
    """Recovery leaves running for pending or failed_transient (or, when a cancel was
    requested, cancelled or blocked): every one must be allowed."""
    allowed = set(OWNED_FROM)
    for target in (Status.PENDING, Status.FAILED_TRANSIENT, Status.CANCELLED, Status.BLOCKED):
        allowed &= set(sources_of(target, among=OWNED_FROM))
    return sorted(str(s) for s in allowed)


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for a service name."""
    import hashlib

    digest = hashlib.sha256(f"veracity:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class RunnerLock:
    """What ``Store.single_runner`` yields: truthy when the lock was taken; ``held()`` asks
    whether it is still held (a PostgreSQL session can be terminated under a tick)."""

    def __init__(self, acquired: bool, check: Callable[[], Awaitable[bool]] | None = None):
        self.acquired = acquired
        self._check = check

    def __bool__(self) -> bool:
        return self.acquired

    async def held(self) -> bool:
        if not self.acquired:
            return False
        return True if self._check is None else await self._check()
