"""veracity.generations.Generations refuses a bad configuration as the app is built, and
registers one finite reconciler workflow."""

from __future__ import annotations

from typing import Any

import pytest

from veracity import App
from veracity.generations import Generations

GOOD: dict[str, Any] = {
    "reconciler": "example:service/reconciler.run",
    "managed": "example:service/worker.run-cancellable",
    "binding": "control_plane",
    "desired_keys": lambda: ["A"],
}


@pytest.mark.parametrize(("change", "says"), [
    ({"managed": "example:service/worker.run"}, "must end in -cancellable"),
    ({"reconciler": "Reconciler"}, "is not of the form"),
    ({"start": "nope"}, "is not of the form"),
    ({"ffqn_prefix": "Example:"}, "cannot begin a workflow name"),
    ({"ffqn_prefix": "example:other/"}, "does not match the managed workflow"),
    ({"key_index": -1}, "key_index must not be negative"),
    ({"page_size": 0}, "page_size must be 1 to 1000"),
    ({"page_size": 1001}, "page_size must be 1 to 1000"),
    ({"concurrency": 0}, "concurrency must be at least 1"),
], ids=["not-cancellable", "bad-reconciler", "bad-start", "bad-prefix", "other-prefix",
        "key-index", "page-0", "page-1001", "concurrency"])
def test_a_bad_configuration_is_refused(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Generations(**{**GOOD, **change})


def test_it_registers_the_reconciler_workflow_only() -> None:
    app = App()
    Generations(**GOOD).register(app)
    assert list(app) == ["example:service/reconciler.run"]
    with pytest.raises(ValueError, match="registered twice"):
        Generations(**GOOD).register(app)
