"""The transition table, exhaustively."""

from __future__ import annotations

import inspect
import itertools
import re
from pathlib import Path

import pytest

from veracity.core import states as states_module
from veracity.core.states import (
    TERMINAL,
    TRANSITIONS,
    Status,
    TransitionError,
    can_transition,
    check_transition,
    sources_of,
)

NON_TERMINAL = {Status.PENDING, Status.RUNNING, Status.BLOCKED, Status.PAUSED}

# The expected graph, written out independently of the module (docs/states.md).
EXPECTED = {
    (Status.PENDING, Status.RUNNING),
    (Status.PENDING, Status.PAUSED),
    (Status.PENDING, Status.CANCELLED),
    (Status.PENDING, Status.FAILED_TRANSIENT),
    (Status.RUNNING, Status.PENDING),
    (Status.RUNNING, Status.BLOCKED),
    (Status.RUNNING, Status.PAUSED),
    (Status.RUNNING, Status.COMPLETED),
    (Status.RUNNING, Status.FAILED),
    (Status.RUNNING, Status.FAILED_TRANSIENT),
    (Status.RUNNING, Status.CANCELLED),
    (Status.BLOCKED, Status.PENDING),
    (Status.BLOCKED, Status.PAUSED),
    (Status.BLOCKED, Status.CANCELLED),
    (Status.BLOCKED, Status.FAILED_TRANSIENT),
    (Status.PAUSED, Status.PENDING),
    (Status.PAUSED, Status.BLOCKED),
    (Status.PAUSED, Status.CANCELLED),
    (Status.PAUSED, Status.FAILED_TRANSIENT),
}


def test_values_are_the_design_names():
    assert [s.value for s in Status] == [
        "pending", "running", "blocked", "paused",
        "completed", "failed", "failed_transient", "cancelled",
    ]


def test_every_state_has_a_docstring_and_a_row():
    for status in Status:
        assert status in TRANSITIONS
    source = inspect.getsource(states_module)
    for status in Status:
        # each member is followed by its own docstring in the module
        assert f'{status.name} = "{status.value}"\n    """' in source, status


def test_terminal_set():
    assert {Status.COMPLETED, Status.FAILED, Status.FAILED_TRANSIENT, Status.CANCELLED} == TERMINAL
    for status in Status:
        assert status.is_terminal == (status not in NON_TERMINAL)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(Status, Status)))
def test_each_pair(source, target):
    allowed = (source, target) in EXPECTED
    assert can_transition(source, target) is allowed
    if allowed:
        check_transition(source, target)
    else:
        with pytest.raises(TransitionError):
            check_transition(source, target)


def test_terminal_is_final():
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()


def test_no_self_loops():
    for status in Status:
        assert status not in TRANSITIONS[status]


def test_only_the_owner_path_reaches_completed():
    # docs/states.md, guarantee 3: completed is entered only from running (a worker or /complete)
    assert sources_of(Status.COMPLETED) == (Status.RUNNING,)
    assert sources_of(Status.FAILED) == (Status.RUNNING,)


def test_sources_of_restricted():
    assert sources_of(Status.RUNNING, among=[Status.PENDING]) == (Status.PENDING,)
    assert set(sources_of(Status.CANCELLED)) == NON_TERMINAL
    with pytest.raises(TransitionError, match="cannot be entered from completed"):
        sources_of(Status.PENDING, among=[Status.COMPLETED])


def test_every_non_terminal_state_can_end():
    # nothing gets stuck: each non-terminal state reaches a terminal one
    for status in NON_TERMINAL:
        seen, frontier = {status}, [status]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL


def test_the_graph_of_the_states_guide_is_the_transition_table() -> None:
    """docs/states.md's diagram has an edge for each transition of TRANSITIONS and no
    other; every terminal state ends, and submission enters at pending."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "states.md").read_text()
    (diagram,) = re.findall(r"^```mermaid\n(.*?)^```", guide, flags=re.S | re.M)
    edges = re.findall(r"^\s*(\S+) --> (\S+?)(?::|$)", diagram, flags=re.M)
    drawn = {(a, b) for a, b in edges if "[*]" not in (a, b)}
    assert drawn == {(str(s), str(t)) for s, targets in TRANSITIONS.items() for t in targets}
    assert {a for a, b in edges if b == "[*]"} == {str(s) for s in TERMINAL}
    assert [b for a, b in edges if a == "[*]"] == ["pending"]
