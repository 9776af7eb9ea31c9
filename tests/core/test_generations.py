"""The generation reconciler's decision (veracity.core.generations.plan): each row of its
table, bad input, and every combination of up to three executions over two keys, two
deployments, three workflows and both request flags checked against what the table says."""

from __future__ import annotations

import dataclasses
import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from veracity.core.generations import (
    MissingKey,
    Observed,
    Plan,
    Reason,
    Retirement,
    desired_keys,
    key_of,
    legacy_name,
    plan,
)

MANAGED = "example:service/worker.run-cancellable"
LEGACY = "example:service/worker.run"
OTHER = "example:service/worker.run-cancellable2"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def obs(ident: str, key: object = "A", *, ffqn: str = MANAGED, dep: str = "d2",
        at: int = 0, status: str = "blocked", cancel: bool = False, pause: bool = False,
        params: object = None) -> Observed:
    return Observed(id=ident, ffqn=ffqn, deployment_id=dep,
                    params=[key] if params is None else params,
                    created_at=T0 + timedelta(seconds=at), status=status,
                    cancel_requested=cancel, pause_requested=pause)


def decide(observed: list[Observed], desired: list[str], **kw: object) -> Plan:
    return plan(observed, desired, current_deployment="d2", managed_ffqn=MANAGED, **kw)  # type: ignore[arg-type]


def test_nothing_running_starts_every_desired_key_in_order_once() -> None:
    assert decide([], ["B", "A", "B"]) == Plan(start=("B", "A"))


def test_a_current_execution_per_key_is_kept_and_nothing_started() -> None:
    got = decide([obs("1", "A"), obs("2", "B")], ["A", "B"])
    assert got == Plan(keep={"A": "1", "B": "2"})


def test_older_deployments_are_cancelled_and_their_keys_started() -> None:
    got = decide([obs("1", "A", dep="d1"), obs("2", "B", dep="d1")], ["A", "B"])
    assert got.cancel == (Retirement("1", "A", Reason.OLDER_DEPLOYMENT),
                          Retirement("2", "B", Reason.OLDER_DEPLOYMENT))
    assert (got.keep, got.start, got.pause) == ({}, ("A", "B"), ())


def test_the_newest_current_one_is_kept_and_its_duplicates_cancelled() -> None:
    got = decide([obs("x", "A", at=1), obs("y", "A", at=3), obs("z", "A", at=2)], ["A"])
    assert got.keep == {"A": "y"}
    assert sorted(got.cancel, key=lambda r: r.id) == [
        Retirement("x", "A", Reason.DUPLICATE), Retirement("z", "A", Reason.DUPLICATE)]
    assert got.start == ()


def test_two_created_in_one_instant_are_told_apart_by_id_the_same_way_every_time() -> None:
    one = decide([obs("b", "A"), obs("a", "A")], ["A"])
    two = decide([obs("a", "A"), obs("b", "A")], ["A"])
    assert one.keep == two.keep == {"A": "b"}
    assert one.cancel == two.cancel == (Retirement("a", "A", Reason.DUPLICATE),)


def test_a_key_no_longer_desired_is_retired_whatever_its_deployment() -> None:
    got = decide([obs("1", "A"), obs("2", "B"), obs("3", "B", dep="d1")], ["A"])
    assert got.keep == {"A": "1"}
    assert got.cancel == (Retirement("2", "B", Reason.NOT_DESIRED),
                          Retirement("3", "B", Reason.NOT_DESIRED))


def test_one_whose_cancel_was_requested_is_cancelled_again_and_replaced() -> None:
    got = decide([obs("1", "A", cancel=True, status="running")], ["A"])
    assert got.cancel == (Retirement("1", "A", Reason.CANCEL_REQUESTED),)
    assert got.start == ("A",)


def test_a_current_execution_an_operator_paused_is_kept() -> None:
    got = decide([obs("1", "A", status="paused")], ["A"])
    assert got == Plan(keep={"A": "1"})


def test_legacy_executions_are_paused_never_cancelled_and_their_keys_started() -> None:
    got = decide([obs("L", "A", ffqn=LEGACY, dep="d2")], ["A"])
    assert got == Plan(pause=("L",), start=("A",))


def test_a_legacy_execution_already_paused_or_pausing_is_left_as_it_is() -> None:
    got = decide([obs("L1", ffqn=LEGACY, status="paused"),
                  obs("L2", ffqn=LEGACY, status="running", pause=True)], ["A"])
    assert got == Plan(start=("A",))


def test_a_legacy_execution_needs_no_key() -> None:
    got = decide([obs("L", ffqn=LEGACY, params=[])], [])
    assert got == Plan(pause=("L",))


def test_other_workflows_the_prefix_matched_are_ignored() -> None:
    got = decide([obs("o", "A", ffqn=OTHER, dep="d1")], ["A"])
    assert got == Plan(start=("A",), ignored=("o",))


def test_the_key_is_read_at_its_index() -> None:
    got = decide([obs("1", params=[3, "A"])], ["A"], key_index=1)
    assert got.keep == {"A": "1"}


@pytest.mark.parametrize(("params", "says"), [
    ([], "have no element 0"),
    (None, "have no element 0"),
    ({"key": "A"}, "have no element 0"),
    ([7], "not a non-empty string"),
    ([""], "not a non-empty string"),
    (["  "], "not a non-empty string"),
    ([None], "not a non-empty string"),
], ids=["empty", "null", "object", "number", "blank", "spaces", "null-key"])
def test_managed_params_without_the_key_decide_nothing(params: object, says: str) -> None:
    bad = Observed(id="bad", ffqn=MANAGED, deployment_id="d1", params=params, created_at=T0)
    with pytest.raises(MissingKey) as refused:
        decide([obs("1", "A", dep="d1"), bad, obs("L", ffqn=LEGACY)], ["A"])
    assert f"execution bad of {MANAGED} has no key" in str(refused.value)
    assert says in str(refused.value)
    assert MissingKey.retryable is False


def test_key_of_says_which_element_it_wanted() -> None:
    with pytest.raises(MissingKey, match="no element 2"):
        key_of(obs("1", params=["a", "b"]), 2)


@pytest.mark.parametrize("bad", [["A", ""], ["A", 3], [None], [" "]])
def test_a_bad_desired_key_is_refused(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="a desired key must be a non-empty string"):
        desired_keys(bad)
    with pytest.raises(ValueError, match="a desired key"):
        decide([], bad)  # type: ignore[arg-type]


def test_the_managed_name_must_be_cancellable() -> None:
    assert legacy_name(MANAGED) == LEGACY
    with pytest.raises(ValueError, match="must end in -cancellable"):
        plan([], ["A"], current_deployment="d2", managed_ffqn=LEGACY)


def test_a_negative_key_index_is_refused() -> None:
    with pytest.raises(ValueError, match="key_index"):
        decide([], ["A"], key_index=-1)


def test_an_execution_listed_twice_is_decided_once() -> None:
    kept = obs("1", "A")
    got = decide([kept, obs("0", "A", at=-1), kept, obs("L", ffqn=LEGACY), obs("L", ffqn=LEGACY)],
                  ["A"])
    assert got == Plan(keep={"A": "1"}, cancel=(Retirement("0", "A", Reason.DUPLICATE),),
                       pause=("L",))


def test_an_observation_has_no_request_unless_it_says_so() -> None:
    plain = Observed(id="1", ffqn=MANAGED, deployment_id="d2", params=["A"], created_at=T0)
    assert (plain.status, plain.cancel_requested, plain.pause_requested) == (
        "pending", False, False)
    assert decide([plain], ["A"]) == Plan(keep={"A": "1"})
    legacy = Observed(id="L", ffqn=LEGACY, deployment_id="d2", params=["A"], created_at=T0)
    assert decide([legacy], []) == Plan(pause=("L",))


def test_the_decision_values_are_immutable() -> None:
    values: list[tuple[object, str]] = [
        (obs("1"), "id"), (Plan(), "start"), (Retirement("1", "A", Reason.DUPLICATE), "id")]
    for value, name in values:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, "2")
        assert not hasattr(value, "__dict__")  # slots: no stray attributes either


def test_plan_takes_its_settings_by_name() -> None:
    with pytest.raises(TypeError):
        plan([], ["A"], "d2", MANAGED)  # type: ignore[call-arg]


def test_a_long_value_is_shortened_in_messages() -> None:
    long_params = ["x" * 200]
    with pytest.raises(MissingKey) as refused:
        key_of(obs("1", params=long_params), 1)
    shown = repr(long_params)[:77] + "..."
    assert f"its params {shown} have no element 1" in str(refused.value)
    exactly = ["y" * 76]  # its repr is 80 characters: shown whole
    assert len(repr(exactly)) == 80
    with pytest.raises(MissingKey, match=re.escape(f"its params {exactly!r} have")):
        key_of(obs("1", params=exactly), 1)
    over = ["y" * 77]  # 81: shortened to 80
    with pytest.raises(MissingKey) as refused:
        key_of(obs("1", params=over), 1)
    assert f"its params {repr(over)[:77]}... have" in str(refused.value)


# -- every small case ----------------------------------------------------------------------

SHAPES = [
    *[dict(ffqn=MANAGED, key=key, dep=dep, cancel=cancel)
      for key in ("A", "B") for dep in ("d1", "d2") for cancel in (False, True)],
    dict(ffqn=LEGACY, status="blocked"),
    dict(ffqn=LEGACY, status="paused"),
    dict(ffqn=LEGACY, status="running", pause=True),
    dict(ffqn=OTHER, dep="d1"),
]


def cases() -> list[tuple[list[Observed], list[str]]]:
    """Every multiset of up to four shapes (two created in one instant, two a second
    later), against three sets of desired keys."""
    out = []
    for n in range(5):
        for combo in itertools.combinations_with_replacement(range(len(SHAPES)), n):
            observed = [obs(f"e{i}", at=i % 2, **SHAPES[j])  # type: ignore[arg-type]
                        for i, j in enumerate(combo)]
            for desired in ([], ["A"], ["B", "A"]):
                out.append((observed, desired))
    return out


def test_every_small_case_follows_the_table() -> None:
    checked = 0
    for observed, desired in cases():
        got = decide(observed, desired)
        assert _same(got, decide(list(reversed(observed)), desired)), observed
        by_id = {o.id: o for o in observed}
        cancelled = [r.id for r in got.cancel]
        kept = list(got.keep.values())
        # each execution gets exactly one decision
        decided = [*cancelled, *kept, *got.pause, *got.ignored]
        untouched_legacy = [o.id for o in observed if o.ffqn == LEGACY
                            and (o.status == "paused" or o.pause_requested)]
        assert sorted(decided + untouched_legacy) == sorted(by_id), (observed, got)
        for ident in got.ignored:
            assert by_id[ident].ffqn == OTHER
        for ident in got.pause:
            o = by_id[ident]
            assert o.ffqn == LEGACY and o.status != "paused" and not o.pause_requested
        for r in got.cancel:
            o = by_id[r.id]
            assert o.ffqn == MANAGED  # legacy ones are never cancelled
            expected = (Reason.CANCEL_REQUESTED if o.cancel_requested
                        else Reason.NOT_DESIRED if o.params[0] not in desired
                        else Reason.OLDER_DEPLOYMENT if o.deployment_id != "d2"
                        else Reason.DUPLICATE)
            assert r.reason == expected, (observed, desired, got)
        for key, ident in got.keep.items():
            o = by_id[ident]
            assert (o.ffqn, o.params[0], o.deployment_id, o.cancel_requested) == (
                MANAGED, key, "d2", False)
            rivals = [c for c in observed if c.ffqn == MANAGED and c.params[0] == key
                      and c.deployment_id == "d2" and not c.cancel_requested]
            assert max(rivals, key=lambda c: (c.created_at, c.id)) is o
        # every desired key has one kept execution or is started, never both
        assert list(got.keep) + list(got.start) == [
            k for k in desired if k in got.keep] + list(got.start)
        assert sorted([*got.keep, *got.start]) == sorted(desired)
        checked += 1
    assert checked == 3 * 1820


def _same(a: Plan, b: Plan) -> bool:
    """Equal up to the order of the listing (cancels and pauses are a set)."""
    return (a.keep, sorted(a.cancel, key=lambda r: r.id), sorted(a.pause), a.start,
            sorted(a.ignored)) == (b.keep, sorted(b.cancel, key=lambda r: r.id),
                                   sorted(b.pause), b.start, sorted(b.ignored))


def test_the_guides_missing_key_message_is_the_one_made() -> None:
    """docs/generations.md's "Bad input" shows the message word for word (its id shortened
    to 01a2...e7)."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "generations.md").read_text()
    (shown,) = re.findall(r"^```\n(execution .*? has no key: .*)\n```", guide, flags=re.M)
    ident = "01a24e3d-4855-7add-b542-8f161c1638e7"
    bad = Observed(id=ident, ffqn="monitors:repo/monitor.run-cancellable",
                   deployment_id="d1", params=[], created_at=T0)
    with pytest.raises(MissingKey) as refused:
        key_of(bad, 0)
    assert str(refused.value).replace(ident, "01a2...e7") == shown
