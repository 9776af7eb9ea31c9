"""Workers: claim executions, run workflows under leases, checkpoint steps.

The names below load on first use, so that importing the workflow Context does not pull in
the worker and its database drivers."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from veracity.worker.context import (
        Context,
        ExecutionInterrupted,
        NondeterminismError,
        NotJSONError,
        StepFailed,
    )
    from veracity.worker.runner import Worker

__all__ = [
    "Context",
    "ExecutionInterrupted",
    "NondeterminismError",
    "NotJSONError",
    "StepFailed",
    "Worker",
]

_WHERE = {name: "veracity.worker.context" for name in __all__} | {
    "Worker": "veracity.worker.runner"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
