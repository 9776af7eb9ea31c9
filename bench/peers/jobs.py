"""What every system's job does, so that the workloads are the same on each.

``noop`` does nothing; ``mark`` appends ``start KEY TIME`` to the marks file (the
environment's ``BENCH_MARKS``) as it starts, ``time.time()`` of this machine, which the
submitter's clock shares; ``slow`` marks its start, sleeps ``SLOW_SECONDS`` and marks
``done KEY TIME``: the kill -9 workload's job, whose done marks show duplicates and losses.
"""

from __future__ import annotations

import asyncio
import os
import time

SLOW_SECONDS = 2.0


def mark(what: str, key: str) -> None:
    path = os.environ.get("BENCH_MARKS")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {key} {time.time():.6f}\n")


async def run(kind: str, key: str) -> None:
    if kind == "noop":
        return
    mark("start", key)
    if kind == "slow":
        await asyncio.sleep(SLOW_SECONDS)
        mark("done", key)


def read_marks(path: str) -> dict[str, dict[str, list[float]]]:
    """{"start"|"done": {key: [times]}}."""
    out: dict[str, dict[str, list[float]]] = {"start": {}, "done": {}}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    out[parts[0]].setdefault(parts[1], []).append(float(parts[2]))
    except FileNotFoundError:
        pass
    return out
