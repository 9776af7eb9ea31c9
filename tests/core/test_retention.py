"""Retention's decision (veracity.core.retention): every rule, and the retry fixpoint."""

from __future__ import annotations

import uuid

import pytest

from veracity.core.retention import (
    Family,
    KeepReason,
    Member,
    decide_prune,
    families_from,
    leaves_order,
    within,
)
from veracity.core.states import TERMINAL, Status


def ids(n: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(n)]


def member(i: uuid.UUID, status: Status = Status.COMPLETED, *, old: bool = True,
           retried_by: frozenset[uuid.UUID] = frozenset(), cron: bool = False,
           flagged: bool = False, parent: uuid.UUID | None = None, depth: int = 0
           ) -> Member:
    return Member(i, status, ended_before_cutoff=old and status.is_terminal,
                  retried_by=retried_by, cron_latest=cron, flagged=flagged,
                  parent_id=parent, depth=depth)


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


@pytest.mark.parametrize("where", ["root", "child"])
def test_a_family_with_a_flagged_member_stays(where: str) -> None:
    # a flagged execution stays listed until its flag is cleared (docs/external.md)
    root, child = ids(2)
    fam = Family(root, (member(root, Status.FAILED_TRANSIENT, flagged=where == "root"),
                        member(child, flagged=where == "child")))
    assert decide_prune([fam]).kept == {root: KeepReason.FLAGGED}


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


def leaves_first(family: Family, limit: int) -> Family:
    """The part of ``family`` a batch of ``limit`` deletes first."""
    return Family(family.root, tuple(leaves_order(family)[:limit]))


def tree(root: uuid.UUID, shape: dict[uuid.UUID, list[uuid.UUID]],
         retried: frozenset[uuid.UUID] = frozenset()) -> Family:
    """A family from parent -> children (depths from the root); ``retried``: members an
    execution retries."""
    members = [member(root, retried_by=frozenset({uuid.uuid4()}) if root in retried
                      else frozenset())]
    level = [(root, 0)]
    while level:
        nxt = []
        for parent, depth in level:
            for kid in shape.get(parent, []):
                members.append(member(kid, parent=parent, depth=depth + 1,
                                      retried_by=frozenset({uuid.uuid4()})
                                      if kid in retried else frozenset()))
                nxt.append((kid, depth + 1))
        level = nxt
    return Family(root, tuple(members))


def test_within_takes_the_first_families_that_fit_and_always_the_first() -> None:
    a, b, c, d = (tree(r, {r: ids(n)}) for r, n in zip(ids(4), (1, 2, 0, 5), strict=True))
    # sizes 2, 3, 1, 6
    assert within([a, b, c, d], 6) == [a, b, c]
    assert within([a, b, c, d], 5) == [a, b]
    assert within([a, b, c, d], 1) == [a]  # the first, however large
    assert within([d, a], 3) == [d]
    assert within([], 3) == []


def test_leaves_first_takes_the_deepest_members_and_never_the_root() -> None:
    root, k1, k2, g1, g2, g3 = ids(6)
    fam = tree(root, {root: [k1, k2], k1: [g1, g2], k2: [g3]})
    part = leaves_first(fam, 3)
    assert {m.id for m in part.members} == {g1, g2, g3} and part.root == root
    # one more: a child whose own children all go with it
    assert {m.id for m in leaves_first(fam, 5).members} == {g1, g2, g3, k1, k2}
    # the root stays for the last part, whatever the limit
    assert root not in {m.id for m in leaves_first(fam, 100).members}


def test_leaves_first_never_takes_a_member_whose_child_stays() -> None:
    root, k1, k2, g1, g2, g3 = ids(6)
    fam = tree(root, {root: [k1, k2], k1: [g1, g2], k2: [g3]})
    for limit in range(1, 7):
        going = {m.id for m in leaves_first(fam, limit).members}
        assert len(going) <= limit
        below = {k1: {g1, g2}, k2: {g3}}
        for parent, kids in below.items():
            assert parent not in going or kids <= going, (limit, going)


def test_leaves_first_leaves_a_retried_member_and_all_above_it_for_the_last_part() -> None:
    root, k1, k2, g1, g2 = ids(5)
    fam = tree(root, {root: [k1, k2], k1: [g1], k2: [g2]}, retried=frozenset({g1}))
    going = {m.id for m in leaves_first(fam, 10).members}
    assert going == {g2, k2}  # g1 is retried: it, k1 above it and the root wait
