"""Retention's decision (veracity.core.retention): every rule, and the retry fixpoint."""

from __future__ import annotations

import uuid

import pytest

from veracity.core.retention import Family, KeepReason, Member, decide_prune, families_from
from veracity.core.states import TERMINAL, Status


def ids(n: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(n)]


def member(i: uuid.UUID, status: Status = Status.COMPLETED, *, old: bool = True,
           retried_by: frozenset[uuid.UUID] = frozenset(), cron: bool = False) -> Member:
    return Member(i, status, ended_before_cutoff=old and status.is_terminal,
                  retried_by=retried_by, cron_latest=cron)


def lone(i: uuid.UUID, **kw: object) -> Family:
    return Family(i, (member(i, **kw),))  # type: ignore[arg-type]


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_an_old_ended_family_goes_whole(status: Status) -> None:
    root, a, b = ids(3)
    fam = Family(root, (member(root, status), member(a), member(b, Status.FAILED)))
    decision = decide_prune([fam])
    assert decision.delete == [fam] and decision.kept == {}
    assert decision.ids == [root, a, b]


@pytest.mark.parametrize("status", sorted(set(Status) - TERMINAL))
@pytest.mark.parametrize("where", ["root", "child"])
def test_a_family_with_an_unfinished_member_stays(status: Status, where: str) -> None:
    root, child = ids(2)
    members = (member(root, status if where == "root" else Status.COMPLETED),
               member(child, status if where == "child" else Status.COMPLETED))
    decision = decide_prune([Family(root, members)])
    assert decision.delete == [] and decision.kept == {root: KeepReason.UNFINISHED}


def test_a_family_with_a_member_that_ended_after_the_cutoff_stays() -> None:
    root, child = ids(2)
    decision = decide_prune([Family(root, (member(root), member(child, old=False)))])
    assert decision.kept == {root: KeepReason.RECENT}


def test_the_latest_cron_slot_stays() -> None:
    (root,) = ids(1)
    assert decide_prune([lone(root, cron=True)]).kept == {root: KeepReason.CRON_LATEST}


def test_a_family_whose_root_was_not_read_stays() -> None:
    root, child = ids(2)
    assert decide_prune([Family(root, (member(child),))]).kept == {
        root: KeepReason.UNFINISHED}


def test_unfinished_is_the_first_reason_given() -> None:
    root, child = ids(2)
    fam = Family(root, (member(root, cron=True, old=False), member(child, Status.RUNNING)))
    assert decide_prune([fam]).kept == {root: KeepReason.UNFINISHED}


def test_an_original_retried_by_an_execution_that_stays_stays() -> None:
    original, retry = ids(2)
    decision = decide_prune([lone(original, retried_by=frozenset({retry}))])
    assert decision.kept == {original: KeepReason.RETRIED} and decision.delete == []


def test_an_original_goes_with_its_retry_in_the_same_batch() -> None:
    original, retry = ids(2)
    fams = [lone(original, retried_by=frozenset({retry})), lone(retry)]
    assert decide_prune(fams).ids == [original, retry]


def test_keeping_a_retry_keeps_the_chain_of_originals_behind_it() -> None:
    # a <- b <- c <- d (each retried by the next); d is still running
    a, b, c, d = ids(4)
    fams = [lone(a, retried_by=frozenset({b})), lone(b, retried_by=frozenset({c})),
            lone(c, retried_by=frozenset({d})), lone(d, status=Status.RUNNING)]
    decision = decide_prune(fams)
    assert decision.delete == []
    assert decision.kept == {a: KeepReason.RETRIED, b: KeepReason.RETRIED,
                             c: KeepReason.RETRIED, d: KeepReason.UNFINISHED}


def test_a_retry_inside_another_family_counts_when_that_family_goes() -> None:
    root, child, original = ids(3)
    fam = Family(root, (member(root), member(child)))
    fams = [lone(original, retried_by=frozenset({child})), fam]
    assert set(decide_prune(fams).ids) == {root, child, original}


def test_families_from_groups_members_by_root_in_first_seen_order() -> None:
    r1, r2, c1 = ids(3)
    rows = [(r2, member(r2)), (r1, member(r1)), (r1, member(c1))]
    assert families_from(rows) == [Family(r2, (member(r2),)),
                                   Family(r1, (member(r1), member(c1)))]
