"""Veracity: durable workflow execution that never lies about the state of an execution."""

from veracity.app import App, WorkflowDef
from veracity.core.retry import RetryPolicy
from veracity.core.states import Status
from veracity.worker.context import (
    Context,
    ExecutionInterrupted,
    NondeterminismError,
    NotJSONError,
    StepFailed,
)
from veracity.worker.http import HttpOutsideStep, HttpRefused

__all__ = [
    "App",
    "Context",
    "ExecutionInterrupted",
    "HttpOutsideStep",
    "HttpRefused",
    "NondeterminismError",
    "NotJSONError",
    "RetryPolicy",
    "Status",
    "StepFailed",
    "WorkflowDef",
]
__version__ = "0.1.0"
