"""Veracity: durable workflow execution that never lies about the state of an execution."""

from veracity._app import App, WorkflowDef
from veracity.core.states import Status

__all__ = ["App", "Status", "WorkflowDef"]
__version__ = "0.1.0"
