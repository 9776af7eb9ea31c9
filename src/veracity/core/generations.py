"""The generation reconciler's decision (docs/generations.md): pure code, no I/O.

Given the unfinished executions a listing found (:class:`Observed`), the desired logical
keys and the reconciler's own deployment, :func:`plan` says what to keep, cancel, pause and
start. The activity in :mod:`veracity.generations` only fetches the observations and carries
the plan out.

Per observed execution, in this order::

    its workflow                 its key / deployment                  decision
    ---------------------------  ------------------------------------  -------------------
    neither managed nor legacy   -                                     ignored (untouched)
    legacy (name without         -                                     pause, unless paused
      -cancellable)                                                      or pause requested
    managed                      params without the key                MissingKey: no plan
    managed, cancel requested    -                                     cancel (again: its
                                                                         retirement repaired)
    managed                      key not desired                       cancel (retired)
    managed                      older deployment (not current)        cancel (old)
    managed, current deployment  newest of its key                     keep
    managed, current deployment  not the newest of its key             cancel (duplicate)

"Newest" is the latest ``created_at``, then the greatest id (two executions created in the
same instant are still told apart, the same way by every run). A kept execution may be
paused by an operator: it is still kept (nothing replaces it). Every desired key with no
kept execution is started, in the order the keys were given (duplicates once).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from veracity.core.ffqn import CANCELLABLE_SUFFIX

__all__ = [
    "MissingKey",
    "Observed",
    "Plan",
    "Reason",
    "Retirement",
    "legacy_name",
    "plan",
]


class MissingKey(ValueError):
    """A managed execution whose creation params do not hold the logical key: nothing can
    be decided for it, so nothing is done at all. Asking again changes nothing: a step
    that meets it is not retried."""

    retryable = False


class Reason(StrEnum):
    """Why an execution is cancelled."""

    OLDER_DEPLOYMENT = "older deployment"
    DUPLICATE = "duplicate"
    NOT_DESIRED = "key not desired"
    CANCEL_REQUESTED = "cancel requested"


@dataclass(frozen=True, slots=True)
class Observed:
    """One unfinished execution as the listing showed it."""

    id: str
    ffqn: str
    deployment_id: str
    params: Any
    created_at: datetime
    status: str = "pending"
    cancel_requested: bool = False
    pause_requested: bool = False


@dataclass(frozen=True, slots=True)
class Retirement:
    id: str
    key: str
    reason: Reason


@dataclass(frozen=True, slots=True)
class Plan:
    keep: dict[str, str] = field(default_factory=dict)
    """Desired key -> the id of the execution kept for it."""
    cancel: tuple[Retirement, ...] = ()
    pause: tuple[str, ...] = ()
    """Legacy executions to pause (ids)."""
    start: tuple[str, ...] = ()
    """Desired keys with no execution kept: start one each."""
    ignored: tuple[str, ...] = ()
    """Listed executions of other workflows (the prefix matched them): left alone."""


def legacy_name(managed_ffqn: str) -> str:
    """The managed workflow's name without ``-cancellable``: its legacy executions are
    paused, never cancelled (they cannot be)."""
    if not managed_ffqn.endswith(CANCELLABLE_SUFFIX):
        raise ValueError(f"the managed workflow {managed_ffqn!r} must end in "
                         f"{CANCELLABLE_SUFFIX}: the reconciler retires its executions by "
                         "cancelling them")
    return managed_ffqn.removesuffix(CANCELLABLE_SUFFIX)


def key_of(execution: Observed, key_index: int) -> str:
    """The logical key in a managed execution's params; :class:`MissingKey` if absent."""
    params = execution.params
    if not isinstance(params, list) or len(params) <= key_index:
        raise MissingKey(
            f"execution {execution.id} of {execution.ffqn} has no key: its params "
            f"{_short(params)} have no element {key_index} (the logical key)")
    key = params[key_index]
    if not isinstance(key, str) or not key.strip():
        raise MissingKey(
            f"execution {execution.id} of {execution.ffqn} has no key: element {key_index} "
            f"of its params is {_short(key)}, not a non-empty string")
    return key


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def desired_keys(keys: Iterable[Any]) -> list[str]:
    """The desired keys in order, each once; ValueError for one that is not a non-empty
    string (a key is a string, as in the managed workflow's params)."""
    seen: dict[str, None] = {}
    for key in keys:
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"a desired key must be a non-empty string, not {_short(key)}")
        seen.setdefault(key, None)
    return list(seen)


def plan(observed: Sequence[Observed], desired: Iterable[Any], *, current_deployment: str,
         managed_ffqn: str, key_index: int = 0) -> Plan:
    """What to keep, cancel, pause and start (the table in this module's docstring).

    Raises :class:`MissingKey` if any managed execution lacks its key, and ValueError for
    a bad desired key or managed name: before anything is decided, so a caller acting on
    the plan does nothing at all."""
    legacy = legacy_name(managed_ffqn)
    if key_index < 0:
        raise ValueError("key_index must not be negative")
    wanted = desired_keys(desired)
    wanted_set = set(wanted)
    managed: list[tuple[str, Observed]] = []
    pause: list[str] = []
    ignored: list[str] = []
    for execution in observed:
        if execution.ffqn == managed_ffqn:
            managed.append((key_of(execution, key_index), execution))
        elif execution.ffqn == legacy:
            if execution.status != "paused" and not execution.pause_requested:
                pause.append(execution.id)
        else:
            ignored.append(execution.id)

    cancel: list[Retirement] = []
    newest: dict[str, Observed] = {}
    for key, execution in managed:
        if execution.cancel_requested:
            cancel.append(Retirement(execution.id, key, Reason.CANCEL_REQUESTED))
        elif key not in wanted_set:
            cancel.append(Retirement(execution.id, key, Reason.NOT_DESIRED))
        elif execution.deployment_id != current_deployment:
            cancel.append(Retirement(execution.id, key, Reason.OLDER_DEPLOYMENT))
        else:
            best = newest.get(key)
            if best is None or _order(execution) > _order(best):
                if best is not None:
                    cancel.append(Retirement(best.id, key, Reason.DUPLICATE))
                newest[key] = execution
            else:
                cancel.append(Retirement(execution.id, key, Reason.DUPLICATE))
    keep = {key: newest[key].id for key in wanted if key in newest}
    start = tuple(key for key in wanted if key not in newest)
    return Plan(keep=keep, cancel=tuple(cancel), pause=tuple(pause), start=start,
                ignored=tuple(ignored))


def _order(execution: Observed) -> tuple[datetime, str]:
    return execution.created_at, execution.id
