"""SQLite's in-process wake-ups (docs/workers.md, "On SQLite"): with no notifications, the
server's own worker must still learn at once of what happens in its process.

- child to parent: a chain of children ``--depth`` deep (``bench:chain/run.fn``); for each
  hop, the time from a child's ``completed`` event to its parent's next ``running`` event
  (both stamped by the server's clock), p50 and p99. Target: under 50 ms.
- cancel and pause of a running execution: the time from the ``cancel_requested`` /
  ``pause_requested`` event to the ``cancelled`` / ``paused`` one.

The worker's poll interval is set to 30 s and its heartbeat to 60 s, so any figure well
below those shows the in-process path at work.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._util import server

SLOW = {"VERACITY_POLL_INTERVAL": "30", "VERACITY_LEASE_TTL": "240",
        "VERACITY_HEARTBEAT_INTERVAL": "60"}


def history(client: httpx.Client, eid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get(f"/v1/executions/{eid}/history",
                                             params={"limit": 10000}).json()["items"]
    return items


def at(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["at"]).timestamp()


def wait(client: httpx.Client, eid: str, *statuses: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while client.get(f"/v1/executions/{eid}").json()["status"] not in statuses:
        if time.monotonic() > deadline:
            raise SystemExit(f"{eid} not {statuses} within {timeout}s")
        time.sleep(0.01)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeups")
    parser.add_argument("--depth", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, \
            server(f"sqlite:///{Path(folder) / 'wake.db'}", "bench.apps:app", SLOW) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        root = client.post("/v1/executions", json={"ffqn": "bench:chain/run.fn",
                                                   "params": [args.depth]}).json()["id"]
        wait(client, root, "completed")
        hops: list[float] = []
        eid = root
        for _ in range(args.depth):
            events = history(client, eid)
            child = next(e["data"]["child_id"] for e in events if e["kind"] == "child_submitted")
            child_done = next(e for e in history(client, child) if e["kind"] == "completed")
            woken = [e for e in events if e["kind"] == "running" and at(e) >= at(child_done)]
            hops.append((at(woken[0]) - at(child_done)) * 1000)
            eid = child
        print(f"SQLite child end -> parent running: {len(hops)} hops, "
              f"p50 {statistics.median(hops):.1f} ms, p99 {pct(hops, 0.99):.1f} ms")
        for request, entered in (("cancel", "cancelled"), ("pause", "paused")):
            delays: list[float] = []
            for _ in range(args.requests):
                eid = client.post("/v1/executions", json={
                    "ffqn": "bench:ticker/run.fn-cancellable", "params": [10_000_000]}
                ).json()["id"]
                wait(client, eid, "running")
                time.sleep(0.05)
                assert client.put(f"/v1/executions/{eid}/{request}").status_code == 200
                wait(client, eid, entered, timeout=30)
                events = history(client, eid)
                asked = next(e for e in events if e["kind"] == f"{request}_requested")
                done = next(e for e in events if e["kind"] == entered)
                delays.append((at(done) - at(asked)) * 1000)
                if request == "pause":
                    client.put(f"/v1/executions/{eid}/unpause")
                    client.put(f"/v1/executions/{eid}/cancel")
            print(f"SQLite {request} of a running execution -> {entered}: "
                  f"{len(delays)} requests, p50 {statistics.median(delays):.1f} ms, "
                  f"p99 {pct(delays, 0.99):.1f} ms (heartbeat 60 s)")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
