"""The waiting reason of every unfinished state, in words (veracity.core.waiting): each
branch of the table in its docstring, the wait reasons a worker writes and reads back, and
None for every terminal state."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from veracity.core.states import Status
from veracity.core.waiting import (
    SHOWN_CHILDREN,
    Children,
    Facts,
    Holder,
    Wait,
    WaitKind,
    children_reason,
    fmt_time,
    message_reason,
    parked_reason,
    parse_block_reason,
    sleep_reason,
    waiting_reason,
)

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
EARLIER = NOW - timedelta(minutes=5)
IDS = [uuid.UUID(int=i + 1) for i in range(8)]
STRANDED = "no live worker for deployment d-old"


def facts(status: Status, **kw: Any) -> Facts:
    return Facts(status=status, now=NOW, scheduled_at=EARLIER, **kw)


def held(**kw: Any) -> Facts:
    base: dict[str, Any] = {
        "lease_owner": "w1", "lease_expires_at": NOW + timedelta(seconds=90),
        "holder": Holder("w1", NOW - timedelta(seconds=12), True),
    }
    base.update(kw)
    return facts(Status.RUNNING, **base)


@pytest.mark.parametrize("status", [s for s in Status if s.is_terminal])
def test_a_terminal_execution_has_no_waiting_reason(status: Status) -> None:
    assert waiting_reason(facts(status, coverage=STRANDED, wake_at=LATER)) is None


@pytest.mark.parametrize("status", [s for s in Status if not s.is_terminal])
def test_every_unfinished_execution_has_one(status: Status) -> None:
    reason = waiting_reason(facts(status))
    assert isinstance(reason, str) and reason


# -- pending ---------------------------------------------------------------------------------

def test_pending_and_due() -> None:
    assert waiting_reason(facts(Status.PENDING)) == "ready: waiting for a worker to claim it"


def test_pending_and_due_that_no_live_worker_will_claim() -> None:
    assert waiting_reason(facts(Status.PENDING, coverage="no live worker runs a:b/c.d")) == (
        "no live worker runs a:b/c.d")


def test_pending_and_scheduled_later() -> None:
    f = dataclasses.replace(facts(Status.PENDING), scheduled_at=LATER)
    assert waiting_reason(f) == "scheduled for 2030-01-01T12:05:00Z"
    assert waiting_reason(dataclasses.replace(f, coverage=STRANDED)) == (
        f"scheduled for 2030-01-01T12:05:00Z; {STRANDED}")


# -- running, held by a worker ---------------------------------------------------------------

def test_running_held_by_a_live_worker() -> None:
    assert waiting_reason(held()) == (
        "held by worker w1 whose last heartbeat was 12 s ago, lease expires at "
        "2030-01-01T12:01:30Z and recovery will retry it by 2030-01-01T12:02:00Z")


def test_running_held_by_a_worker_that_is_not_live() -> None:
    f = held(holder=Holder("w1", NOW - timedelta(seconds=4.2), False),
             recovery_interval=timedelta(seconds=10))
    assert waiting_reason(f) == (
        "held by worker w1, not live (its last heartbeat was 4 s ago), lease expires at "
        "2030-01-01T12:01:30Z and recovery will retry it by 2030-01-01T12:01:40Z")


@pytest.mark.parametrize("holder", [None, Holder("w1", None, False)])
def test_running_held_by_a_worker_not_registered(holder: Holder | None) -> None:
    assert waiting_reason(held(holder=holder)) == (
        "held by worker w1, which is not registered, lease expires at 2030-01-01T12:01:30Z "
        "and recovery will retry it by 2030-01-01T12:02:00Z")


def test_a_heartbeat_from_a_clock_ahead_is_just_now() -> None:
    f = held(holder=Holder("w1", NOW + timedelta(seconds=1), True))
    assert "whose last heartbeat was just now," in (waiting_reason(f) or "")


def test_recovery_ends_it_on_its_last_attempt() -> None:
    assert waiting_reason(held(attempt=5, max_attempts=5)) == (
        "held by worker w1 whose last heartbeat was 12 s ago, lease expires at "
        "2030-01-01T12:01:30Z and recovery will end it failed_transient (attempt 5 of 5) "
        "by 2030-01-01T12:02:00Z")


def test_cancel_requested_of_a_running_execution() -> None:
    assert waiting_reason(held(cancel_requested_at=EARLIER)) == (
        "cancel requested at 2030-01-01T11:55:00Z: it stops at its next step; held by "
        "worker w1 whose last heartbeat was 12 s ago, lease expires at 2030-01-01T12:01:30Z "
        "and recovery will cancel it by 2030-01-01T12:02:00Z")


def test_pause_requested_of_a_running_execution() -> None:
    assert waiting_reason(held(pause_requested_at=EARLIER)) == (
        "pause requested at 2030-01-01T11:55:00Z: it parks at its next step; held by "
        "worker w1 whose last heartbeat was 12 s ago, lease expires at 2030-01-01T12:01:30Z "
        "and recovery will retry it by 2030-01-01T12:02:00Z")


def test_a_lease_that_expired_recently() -> None:
    f = held(lease_expires_at=NOW - timedelta(seconds=10),
             holder=Holder("w1", NOW - timedelta(seconds=100), False))
    assert waiting_reason(f) == (
        "held by worker w1, not live (its last heartbeat was 100 s ago), lease expired at "
        "2030-01-01T11:59:50Z; recovery will retry it by 2030-01-01T12:00:20Z")


def test_a_lease_that_expired_long_ago_and_no_recovery_ran() -> None:
    f = held(lease_expires_at=NOW - timedelta(minutes=10),
             holder=Holder("w1", NOW - timedelta(minutes=12), False))
    assert waiting_reason(f) == (
        "held by worker w1, not live (its last heartbeat was 720 s ago), lease expired at "
        "2030-01-01T11:50:00Z and recovery, due to retry it by 2030-01-01T11:50:30Z, has "
        "not: is any server or worker running?")


def test_running_without_a_lease_says_running() -> None:
    assert waiting_reason(facts(Status.RUNNING)) == "running"
    assert waiting_reason(facts(Status.RUNNING, cancel_requested_at=EARLIER)) == (
        "cancel requested at 2030-01-01T11:55:00Z: it stops at its next step; running")


def test_running_with_no_live_worker_for_its_deployment() -> None:
    reason = waiting_reason(held(coverage=STRANDED)) or ""
    assert reason.startswith("held by worker w1") and reason.endswith(f"; {STRANDED}")


# -- running, delegated to an engine ---------------------------------------------------------

def test_delegated_with_its_external_id() -> None:
    f = facts(Status.RUNNING, engine="n8n", external_execution_id="981",
              triggered_at=EARLIER)
    assert waiting_reason(f) == (
        "running in engine n8n as run 981 (triggered at 2030-01-01T11:55:00Z)")


def test_delegated_before_its_external_id_is_known() -> None:
    assert waiting_reason(facts(Status.RUNNING, engine="n8n")) == (
        "delegated to engine n8n; its run id is not known yet")


@pytest.mark.parametrize("field", ["cancel_requested_at", "end_requested_at"])
def test_delegated_with_a_stop_requested(field: str) -> None:
    f = facts(Status.RUNNING, engine="n8n", external_execution_id="981", **{field: EARLIER})
    assert waiting_reason(f) == (
        "running in engine n8n as run 981; stop requested at 2030-01-01T11:55:00Z: waiting "
        "for the engine to confirm it")


def test_delegated_and_flagged() -> None:
    f = facts(Status.RUNNING, engine="n8n", external_execution_id="981",
              flag_reason="limit breached", coverage=None)
    assert waiting_reason(f) == (
        "running in engine n8n as run 981; flagged: limit breached")


# -- blocked ---------------------------------------------------------------------------------

def blocked(reason: str | None, **kw: Any) -> Facts:
    return facts(Status.BLOCKED, blocked=None if reason is None else {"reason": reason}, **kw)


def test_asleep() -> None:
    assert waiting_reason(blocked(sleep_reason(), wake_at=LATER)) == (
        "asleep until 2030-01-01T12:05:00Z")
    assert waiting_reason(blocked(sleep_reason())) == "asleep"


@pytest.mark.parametrize(("topic", "shown"), [
    ("approval", '"approval"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("it's", '"it\'s"'),
    ("ünï ✓", '"ünï ✓"'),
    ("a\nb", '"a\\nb"'),
])
def test_waiting_for_a_message(topic: str, shown: str) -> None:
    assert waiting_reason(blocked(message_reason(topic))) == f"waiting for message {shown}"


def test_waiting_for_a_message_with_a_timeout() -> None:
    assert waiting_reason(blocked(message_reason("approval"), wake_at=LATER)) == (
        'waiting for message "approval" until 2030-01-01T12:05:00Z')


def test_waiting_for_children_of_its_join_set() -> None:
    f = blocked(children_reason("0js1"), children={
        "0js1": Children(2, (IDS[0], IDS[1])), "0js0": Children(1, (IDS[2],)),
        None: Children(1, (IDS[3],))})
    assert waiting_reason(f) == (
        f"waiting for 2 children ({IDS[0]}, {IDS[1]}) of join set 0js1")


def test_waiting_for_one_child() -> None:
    f = blocked(children_reason("0js0"), children={"0js0": Children(1, (IDS[0],))})
    assert waiting_reason(f) == f"waiting for 1 child ({IDS[0]}) of join set 0js0"


def test_many_children_are_counted_past_the_first_few() -> None:
    f = blocked(children_reason("0js0"),
                children={"0js0": Children(12, tuple(IDS[:SHOWN_CHILDREN]))})
    shown = ", ".join(str(i) for i in IDS[:SHOWN_CHILDREN])
    assert waiting_reason(f) == f"waiting for 12 children ({shown}, and 7 more) of join set 0js0"


def test_waiting_for_a_join_set_whose_children_all_ended() -> None:
    assert waiting_reason(blocked(children_reason("0js0"))) == (
        "waiting for a child of join set 0js0: each has ended, it is about to wake")


def test_cancelled_while_waiting_for_children_it_may_not_cancel() -> None:
    f = blocked("cancel requested; waiting for 2 children that cannot be cancelled",
                cancel_requested_at=EARLIER,
                children={"0js0": Children(1, (IDS[0],)), None: Children(1, (IDS[1],))})
    assert waiting_reason(f) == (
        f"cancel requested at 2030-01-01T11:55:00Z; waiting for 2 children ({IDS[0]}, "
        f"{IDS[1]}) it may not cancel")


def test_a_reason_written_otherwise_is_shown_as_it_is() -> None:
    assert waiting_reason(blocked("waiting for the moon")) == "waiting for the moon"
    assert waiting_reason(blocked("waiting for the moon", wake_at=LATER)) == (
        "asleep until 2030-01-01T12:05:00Z")


def test_blocked_without_a_blocked_event() -> None:
    assert waiting_reason(blocked(None)) == "waiting"
    assert waiting_reason(blocked(None, wake_at=LATER)) == "asleep until 2030-01-01T12:05:00Z"
    assert waiting_reason(facts(Status.BLOCKED, blocked={"reason": 7})) == "waiting"


def test_blocked_with_no_live_worker_for_its_deployment() -> None:
    assert waiting_reason(blocked(sleep_reason(), wake_at=LATER, coverage=STRANDED)) == (
        f"asleep until 2030-01-01T12:05:00Z; {STRANDED}")


# -- paused ----------------------------------------------------------------------------------

def paused(data: dict[str, Any] | None, **kw: Any) -> Facts:
    return facts(Status.PAUSED, paused=data, **kw)


def test_paused_by_an_operator_while_pending() -> None:
    assert waiting_reason(paused({"by": "ada", "from": "pending"}, paused_from="pending")) == (
        "paused by ada while pending")
    assert waiting_reason(paused({"by": None, "from": "pending"})) == (
        "paused by an operator while pending")
    assert waiting_reason(paused({"by": "  ", "from": "pending"})) == (
        "paused by an operator while pending")


def test_paused_while_blocked_says_what_it_waits_for_once_unpaused() -> None:
    f = paused({"by": "ada", "from": "blocked"}, paused_from="blocked",
               blocked={"reason": message_reason("approval")})
    assert waiting_reason(f) == (
        'paused by ada while blocked; once unpaused, waiting for message "approval"')


def test_paused_with_a_reason() -> None:
    f = paused({"by": "ada", "from": "pending", "reason": "deploy freeze"})
    assert waiting_reason(f) == "paused by ada while pending: deploy freeze"
    f = paused({"by": None, "reason": "deploy freeze"})
    assert waiting_reason(f) == "paused by an operator: deploy freeze"
    assert waiting_reason(paused({"by": "ada", "reason": "  "})) == "paused by ada"


PARKED = {"owner": "w1", "epoch": 3, "reason": "pause requested; parked at a step boundary"}


@pytest.mark.parametrize(("requested", "said"), [
    ({"by": "bob"}, "paused by bob; parked at a step boundary"),
    ({"by": "bob", "reason": "freeze"}, "paused by bob: freeze; parked at a step boundary"),
    ({"by": None}, "paused by an operator; parked at a step boundary"),
    (None, "paused by an operator; parked at a step boundary"),
])
def test_parked_at_a_step_boundary_after_a_pause_request(
    requested: dict[str, Any] | None, said: str
) -> None:
    f = paused(PARKED, pause_requested=requested, paused_from="pending")
    assert waiting_reason(f) == said


def test_parked_on_its_way_into_a_wait() -> None:
    # the newest blocked event is an older wait's: the one it parked at is in this event
    f = paused({"owner": "w1", "epoch": 3, "reason": parked_reason(sleep_reason())},
               pause_requested={"by": "ada", "reason": "freeze"},
               paused_from="blocked", wake_at=LATER, blocked={"reason": children_reason("x")})
    assert waiting_reason(f) == (
        "paused by ada: freeze; parked at its wait (sleep); once unpaused, asleep until "
        "2030-01-01T12:05:00Z")


def test_submitted_paused() -> None:
    f = paused({"ffqn": "a:b/c.d", "params": [], "deployment_id": "d"}, paused_from="pending")
    assert waiting_reason(f) == "submitted paused"


def test_paused_without_a_paused_event() -> None:
    assert waiting_reason(paused(None)) == "paused by an operator"


def test_paused_and_stranded() -> None:
    assert waiting_reason(paused({"by": "ada", "from": "pending"}, coverage=STRANDED)) == (
        f"paused by ada while pending; {STRANDED}")


# -- the reasons a worker writes ---------------------------------------------------------------

@pytest.mark.parametrize("topic", ["approval", "it's", 'say "hi"', "ünï", "a\nb\\c", "x" * 256])
def test_message_reasons_read_back(topic: str) -> None:
    assert parse_block_reason(message_reason(topic)) == Wait(
        WaitKind.MESSAGE, topic=topic, text=message_reason(topic))


def test_sleep_and_children_reasons_read_back() -> None:
    assert parse_block_reason(sleep_reason()) == Wait(WaitKind.SLEEP, text="sleep")
    assert parse_block_reason(children_reason("0js2")) == Wait(
        WaitKind.CHILDREN, join_set="0js2", text=children_reason("0js2"))


@pytest.mark.parametrize("reason", [
    "", "sleeping", "waiting for a message on ", "waiting for a message on approval",
    "waiting for a message on 42", "waiting for a message on 'open",
    "waiting for a message on __import__('os')", "waiting for a child of join set ",
    "cancel requested; stopped at its next await",
])
def test_other_reasons_are_kept_as_written(reason: str) -> None:
    assert parse_block_reason(reason) == Wait(WaitKind.OTHER, text=reason)


def test_times_are_utc_to_the_second() -> None:
    t = datetime(2030, 1, 1, 14, 0, 0, 999_999, tzinfo=timezone(timedelta(hours=2)))
    assert fmt_time(t) == "2030-01-01T12:00:00Z"


def test_the_examples_of_the_operations_guide_are_what_it_says() -> None:
    """docs/operations.md's example of waiting reasons, line by line, made from facts
    (its two `<id>`s stand for the children's ids)."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = guide.split("## Runs that look stuck", 1)[1]
    shown = section.split("```\n", 2)[1].splitlines()
    at = now = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    kids = (IDS[0], IDS[1])
    made = [
        waiting_reason(Facts(Status.BLOCKED, now, at - timedelta(hours=1), wake_at=at,
                             blocked={"reason": sleep_reason()})),
        waiting_reason(Facts(Status.BLOCKED, now, at,
                             blocked={"reason": message_reason("approval")})),
        waiting_reason(Facts(Status.BLOCKED, now, at,
                             blocked={"reason": children_reason("js0")},
                             children={"js0": Children(2, kids)})),
        waiting_reason(Facts(Status.PAUSED, now, at, paused_from="pending",
                             paused={"by": "ada", "from": "pending",
                                     "reason": "deploy freeze"})),
        waiting_reason(Facts(Status.RUNNING, now, at, lease_owner="w-3f2a",
                             lease_expires_at=at + timedelta(minutes=2),
                             holder=Holder("w-3f2a", now - timedelta(seconds=95), False),
                             recovery_interval=timedelta(seconds=30))),
        waiting_reason(Facts(Status.PENDING, now, at,
                             coverage="no live worker for deployment d-41be07a9c3d2e810")),
    ]
    assert [line.replace(f"{kids[0]}, {kids[1]}", "<id>, <id>") for line in made
            if line is not None] == shown
