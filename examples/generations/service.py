"""The generation reconciler example (README.md beside this file; docs/generations.md).

Three workflows: the finite reconciler ``example:service/reconciler.run``, run every minute
by the ``[[cron]]`` entry ``worker_reconcile``; the managed ``example:service/worker.run-
cancellable``, one execution per key of ``keys.txt``, which loops on a message and a durable
sleep; and ``example:service/worker.run``, the legacy name of the same workflow (before it
was made cancellable), whose executions the reconciler pauses.
"""

from __future__ import annotations

import os
from pathlib import Path

from veracity import App, Context
from veracity.generations import Generations

RECONCILER = "example:service/reconciler.run"
WORKER = "example:service/worker.run-cancellable"
LEGACY_WORKER = "example:service/worker.run"
IDLE = 60  # seconds: how long a worker waits for a message, then rests

app = App("example-generations")


def keys_file() -> Path:
    """``keys.txt`` beside the configuration file (``VERACITY_CONFIG``, else
    ``./veracity.toml``)."""
    config = Path(os.environ.get("VERACITY_CONFIG") or "veracity.toml")
    return config.resolve().parent / "keys.txt"


def list_desired_keys() -> list[str]:
    """The keys that should each have a worker: one a line; blank lines and lines starting
    with ``#`` are skipped. Read on every run of the reconciler."""
    lines = keys_file().read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


generations = Generations(
    reconciler=RECONCILER,
    managed=WORKER,
    binding="control_plane",  # the [[http]] entry of veracity.toml
    desired_keys=list_desired_keys,
)
generations.register(app)


def handle(key: str, payload: object) -> str:
    """The work of one message (here: say what it was)."""
    return f"{key} handled {payload!r}"


async def serve(ctx: Context, key: str) -> str:
    """Wait for work on topic ``work``; with none for a minute, rest a minute, durably. The
    message ``"stop"`` ends it."""
    handled = 0
    while True:
        try:
            payload = await ctx.recv("work", timeout=IDLE)
        except TimeoutError:
            await ctx.sleep(IDLE)
            continue
        if payload == "stop":
            return f"{key} stopped after {handled} messages"
        await ctx.step(handle, key, payload)
        handled += 1


app.workflow(WORKER)(serve)
app.workflow(LEGACY_WORKER)(serve)
