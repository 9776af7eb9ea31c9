"""Retention's decision: which ended executions may be deleted (docs/operations.md,
Retention).

Retention deletes executions a whole *family* at a time: a top-level execution (no parent)
and every execution below it (its children, their children, ...), with their history and
messages. A family goes only when all of this holds:

- every member is terminal (``completed``, ``failed``, ``failed_transient``,
  ``cancelled``): a non-terminal execution is never deleted, and no child goes while its
  parent is unfinished, nor before it (a parent's children go with it);
- every member ended (its ``updated_at`` as a terminal row) before the cutoff;
- no member is the latest slot of a ``[[cron]]`` entry: cron reads that slot to know which
  slots already fired (docs/cron.md), so it stays until a newer slot replaces it;
- no member is flagged for an operator (docs/external.md, "The flagged list"): a flagged
  execution stays listed until its flag is cleared (``forced``, never);
- no member is the ``retry_of`` of an execution that stays: a retry replays the recorded
  calls of the execution it retries, so that one goes in the same batch as its retry or
  after it. A retry that is itself deleted does not hold its original back.

The last rule is decided over the whole batch at once: a family held only by retries in
families deleted in the same batch goes too.

A batch deletes at most a given number of executions: the families of its roots, in
order, as long as they fit (:func:`within`). A family larger than that alone goes a part
at a time, from its deepest members up (:func:`leaves_order`), its root last: the order is
decided once, when the family is read, and each later part is checked again under its
lock before it goes. This module does no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from veracity.core.states import Status

__all__ = ["Family", "KeepReason", "Member", "PruneDecision", "decide_prune", "families_from",
           "leaves_order", "within"]


class KeepReason(StrEnum):
    """Why a family was kept (the first reason found, in this order)."""

    UNFINISHED = "unfinished"
    """a member is not terminal"""
    RECENT = "recent"
    """a member ended at or after the cutoff"""
    CRON_LATEST = "cron_latest"
    """a member is the latest slot of a cron entry"""
    FLAGGED = "flagged"
    """a member is on the flagged list"""
    RETRIED = "retried"
    """a member is the ``retry_of`` of an execution that stays"""


@dataclass(frozen=True, slots=True)
class Member:
    """One execution of a family, as retention sees it."""

    id: uuid.UUID
    status: Status
    ended_before_cutoff: bool
    """terminal with ``updated_at`` before the cutoff (False for a non-terminal row)"""
    retried_by: frozenset[uuid.UUID] = frozenset()
    """executions whose ``retry_of`` is this one"""
    cron_latest: bool = False
    """the latest slot of a cron entry started it"""
    flagged: bool = False
    """on the flagged list (its ``flagged_at`` set)"""
    parent_id: uuid.UUID | None = None
    depth: int = 0
    """0 for the family's root, 1 for its children, ..."""


@dataclass(frozen=True, slots=True)
class Family:
    root: uuid.UUID
    members: tuple[Member, ...]

    @property
    def ids(self) -> frozenset[uuid.UUID]:
        return frozenset(m.id for m in self.members)


@dataclass(frozen=True, slots=True)
class PruneDecision:
    delete: list[Family] = field(default_factory=list)
    kept: dict[uuid.UUID, KeepReason] = field(default_factory=dict)
    """root -> why its family stays"""

    @property
    def ids(self) -> list[uuid.UUID]:
        return [m.id for f in self.delete for m in f.members]


def _local_reason(family: Family) -> KeepReason | None:
    if not any(m.id == family.root for m in family.members):
        # the root itself is gone or was never read: nothing can be said of its family
        return KeepReason.UNFINISHED
    if any(not m.status.is_terminal for m in family.members):
        return KeepReason.UNFINISHED
    if not all(m.ended_before_cutoff for m in family.members):
        return KeepReason.RECENT
    if any(m.cron_latest for m in family.members):
        return KeepReason.CRON_LATEST
    if any(m.flagged for m in family.members):
        return KeepReason.FLAGGED
    return None


def decide_prune(families: Iterable[Family]) -> PruneDecision:
    """The families of a batch that may be deleted, and why each other one stays."""
    kept: dict[uuid.UUID, KeepReason] = {}
    candidates: list[Family] = []
    for family in families:
        reason = _local_reason(family)
        if reason is None:
            candidates.append(family)
        else:
            kept[family.root] = reason
    # a family whose members are retried by executions that stay, stays; repeated until
    # nothing changes, as keeping one family may keep the originals its members retried
    while True:
        going: set[uuid.UUID] = set().union(*(f.ids for f in candidates))
        held = [f for f in candidates
                if any(not m.retried_by <= going for m in f.members)]
        if not held:
            break
        for f in held:
            kept[f.root] = KeepReason.RETRIED
        candidates = [f for f in candidates if f.root not in kept]
    return PruneDecision(delete=candidates, kept=kept)


def families_from(rows: Sequence[tuple[uuid.UUID, Member]]) -> list[Family]:
    """Group (root, member) pairs into families, in the order their roots first appear."""
    grouped: dict[uuid.UUID, list[Member]] = {}
    for root, member in rows:
        grouped.setdefault(root, []).append(member)
    return [Family(root, tuple(members)) for root, members in grouped.items()]


def within(families: Sequence[Family], limit: int) -> list[Family]:
    """The first families, in order, whose members number at most ``limit`` together; at
    least the first one, however large (it then goes in parts: :func:`leaves_order`)."""
    taken: list[Family] = []
    count = 0
    for family in families:
        if taken and count + len(family.members) > limit:
            break
        taken.append(family)
        count += len(family.members)
    return taken


def leaves_order(family: Family) -> list[Member]:
    """The order a family too large for one batch goes in, its root and what is held back
    left out (they go with the family's last part, the whole decision ruling on them
    then): deepest members first, so that each member comes after everything below it
    and any leading run of the order can go first. A member that an execution retries is
    held back, and so is everything above it. Any leading run of it is a part that may go
    first: each member comes after everything below it, its root never in it."""
    parent = {m.id: m.parent_id for m in family.members}
    held: set[uuid.UUID] = set()
    for m in family.members:
        if m.retried_by or m.id == family.root:
            up: uuid.UUID | None = m.id
            while up is not None and up not in held:
                held.add(up)
                up = parent.get(up)
    return sorted((m for m in family.members if m.id not in held), key=lambda m: -m.depth)
