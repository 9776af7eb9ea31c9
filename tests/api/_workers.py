"""Registered workers for the API and CLI tests: written through the store, as a worker
registers itself, rather than by starting worker processes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from veracity.clock import ManualClock
from veracity.models import WorkerInfo
from veracity.store import open_store


@dataclass(frozen=True)
class Registered:
    info: WorkerInfo
    started_at: datetime
    stopped_at: datetime | None
    live: bool


def info(worker_id: str, *, pid: int, ffqns: list[str], concurrency: int = 4,
         deployment_id: str = "d-test", upgrade_ffqns: list[str] | None = None,
         heartbeat_interval: float | None = None) -> WorkerInfo:
    return WorkerInfo(id=worker_id, host=f"host-{worker_id}.example", pid=pid,
                      deployment_id=deployment_id, ffqns=ffqns, concurrency=concurrency,
                      upgrade_ffqns=upgrade_ffqns or [],
                      heartbeat_interval=heartbeat_interval)


async def register_workers(database_url: str) -> list[Registered]:
    """Three workers registered at chosen times (a store of their own with a manual clock,
    as worker processes would have): one that stopped heartbeating an hour ago, one that
    stopped cleanly, one live. Newest first."""
    now = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(now - timedelta(hours=1))
    workers = await open_store(database_url, clock=clock)
    try:
        stale = info("w-stale", pid=101, ffqns=["shop:orders/process.run"])
        await workers.worker_register(stale)

        clock.set(now - timedelta(seconds=30))
        stopped = info("w-stopped", pid=202, deployment_id="d-old",
                       ffqns=["shop:mail/send.run", "shop:orders/process.run"])
        await workers.worker_register(stopped)
        clock.set(now - timedelta(seconds=20))
        await workers.worker_stop(stopped.id)

        clock.set(now - timedelta(seconds=10))
        # a heartbeat every 20 s: live for 60 s after its last one (10 s ago)
        live = info("w-live", pid=303, concurrency=16,
                    ffqns=["shop:monitor/stock.run-cancellable", "shop:mail/send.run"],
                    upgrade_ffqns=["shop:mail/send.run"], heartbeat_interval=20.0)
        await workers.worker_register(live)
    finally:
        await workers.close()
    return [
        Registered(live, now - timedelta(seconds=10), None, True),
        Registered(stopped, now - timedelta(seconds=30), now - timedelta(seconds=20), False),
        Registered(stale, now - timedelta(hours=1), None, False),
    ]
