"""Veracity: durable workflow execution that never lies about the state of an execution.

``App`` and the workflow ``Context`` for writing workflows; ``Client`` and ``AsyncClient``
for using a Veracity server from Python, ``AsyncDatabaseClient`` for submitting straight to
its database (docs/client.md). Names load on first use, so
``import veracity`` stays quick.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# the collector's thresholds as they are before an application's code runs (an app that
# sets its own keeps them: veracity/_heap.py)
from veracity import _heap as _heap

if TYPE_CHECKING:
    from veracity.app import App, WorkflowDef
    from veracity.client import (
        ApiError,
        AsyncClient,
        Client,
        ExecutionFailed,
        ServerUnreachable,
        Submission,
        WaitTimeout,
    )
    from veracity.core.retry import RetryPolicy
    from veracity.core.states import Status
    from veracity.direct import AsyncDatabaseClient
    from veracity.worker.context import Context
    from veracity.worker.errors import (
        ExecutionInterrupted,
        InvalidParams,
        NondeterminismError,
        NotJSONError,
        StepFailed,
    )
    from veracity.worker.http import HttpOutsideStep, HttpRefused

_WHERE: dict[str, str] = {
    "App": "veracity.app",
    "WorkflowDef": "veracity.app",
    "RetryPolicy": "veracity.core.retry",
    "Status": "veracity.core.states",
    "Context": "veracity.worker.context",
    "ExecutionInterrupted": "veracity.worker.errors",
    "InvalidParams": "veracity.worker.errors",
    "NondeterminismError": "veracity.worker.errors",
    "NotJSONError": "veracity.worker.errors",
    "StepFailed": "veracity.worker.errors",
    "HttpOutsideStep": "veracity.worker.http",
    "HttpRefused": "veracity.worker.http",
    "Client": "veracity.client",
    "AsyncClient": "veracity.client",
    "AsyncDatabaseClient": "veracity.direct",
    "ApiError": "veracity.client",
    "ExecutionFailed": "veracity.client",
    "ServerUnreachable": "veracity.client",
    "Submission": "veracity.client",
    "WaitTimeout": "veracity.client",
}

__all__ = [
    "ApiError",
    "App",
    "AsyncClient",
    "AsyncDatabaseClient",
    "Client",
    "Context",
    "ExecutionFailed",
    "ExecutionInterrupted",
    "HttpOutsideStep",
    "HttpRefused",
    "InvalidParams",
    "NondeterminismError",
    "NotJSONError",
    "RetryPolicy",
    "ServerUnreachable",
    "Status",
    "StepFailed",
    "Submission",
    "WaitTimeout",
    "WorkflowDef",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
        globals()[name] = value  # loaded once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
