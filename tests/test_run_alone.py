"""Which tests run alone under xdist (tests/conftest.py, ``runs_alone``; README: Tests):
``slow(alone=True)`` in every run, ``slow(alone="sqlite")`` in its SQLite run only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests.conftest import runs_alone


@dataclass
class _CallSpec:
    params: dict[str, Any]


@dataclass
class _Item:
    """What runs_alone reads of a collected test: its closest ``slow`` mark and, for a
    parametrized test, its parameters."""

    mark: pytest.Mark | None
    params: dict[str, Any] | None = None
    callspec: _CallSpec | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.params is not None:
            self.callspec = _CallSpec(self.params)

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.mark if name == "slow" else None


def alone(mark: pytest.MarkDecorator | None, params: dict[str, Any] | None = None) -> bool:
    return runs_alone(cast(pytest.Item, _Item(None if mark is None else mark.mark, params)))


def test_a_test_runs_alone_only_when_its_mark_says_so() -> None:
    assert alone(None) is False
    assert alone(pytest.mark.slow) is False
    assert alone(pytest.mark.slow(alone=False)) is False
    assert alone(pytest.mark.slow(alone=True)) is True
    assert alone(pytest.mark.slow(alone=True), {"backend": "postgresql"}) is True


def test_a_backend_named_by_the_mark_runs_alone_and_the_others_do_not() -> None:
    mark = pytest.mark.slow(alone="sqlite")
    assert alone(mark, {"backend": "sqlite"}) is True
    assert alone(mark, {"backend": "postgresql"}) is False
    assert alone(mark, {"other": "sqlite"}) is False  # not parametrized by backend
    assert alone(mark) is False  # not parametrized at all


def test_the_stalled_worker_tests_run_alone_on_sqlite_only() -> None:
    """The two tests that freeze a worker with SIGSTOP (docs/workers.md, "Recovery")."""
    from tests.worker import test_processes, test_processes_more

    for module, name in ((test_processes, "test_stalled_worker_is_fenced_out_and_its_report_kept"),
                         (test_processes_more,
                          "test_stalled_workers_completion_is_refused_kept_and_logged")):
        marks = [m for m in getattr(getattr(module, name), "pytestmark", []) if m.name == "slow"]
        assert [m.kwargs for m in marks] == [{"alone": "sqlite"}], name
