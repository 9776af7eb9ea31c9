"""Workers: claim executions, run workflows under leases, checkpoint steps."""

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
