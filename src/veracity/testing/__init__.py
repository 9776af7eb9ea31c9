"""Helpers for testing with Veracity.

:func:`replay` replays a recorded execution history against an app's current workflow code,
with no store (:mod:`veracity.worker.replayer`): use it in your own tests to check a code
change against production histories (docs/workflows.md).

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
    from veracity.worker.replayer import ReplayResult, replay, replay_async

__all__ = [
    "CallbackAttempt",
    "FakeN8n",
    "ReplayResult",
    "RunTruth",
    "Script",
    "StopRecord",
    "Transition",
    "Wait",
    "Work",
    "create_app",
    "replay",
    "replay_async",
    "running",
    "serve_asgi_in_thread",
    "serve_in_thread",
]
_REPLAYER = ("ReplayResult", "replay", "replay_async")


def __getattr__(name: str) -> Any:
    if name in _REPLAYER:
        return getattr(import_module("veracity.worker.replayer"), name)
    if name in __all__:
        return getattr(import_module("veracity.testing.fake_n8n"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
