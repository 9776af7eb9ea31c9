"""Test doubles for Veracity's engine adapters.

:mod:`veracity.testing.fake_n8n` is a faithful fake of the parts of n8n that Veracity talks to
(production webhooks, the public executions API, the internal session stop), with scripted runs
and a record of ground truth. The names below are re-exported lazily: importing
:mod:`veracity.testing` loads nothing of the fake (nor starlette, uvicorn) until one is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from veracity.testing.fake_n8n import (
        CallbackAttempt,
        FakeN8n,
        RunTruth,
        Script,
        StopRecord,
        Transition,
        Wait,
        Work,
        create_app,
        running,
        serve_asgi_in_thread,
        serve_in_thread,
    )

__all__ = [
    "CallbackAttempt",
    "FakeN8n",
    "RunTruth",
    "Script",
    "StopRecord",
    "Transition",
    "Wait",
    "Work",
    "create_app",
    "running",
    "serve_asgi_in_thread",
    "serve_in_thread",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("veracity.testing.fake_n8n"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
