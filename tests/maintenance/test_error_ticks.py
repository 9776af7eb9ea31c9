"""A periodic service whose tick cannot even take its lock (the database is down) has had a
failed tick, and says so: ``outcome="error"`` on the reconciler's and on lease recovery's
tick counters, as docs/external.md and docs/workers.md say. The database here is a private
cluster that the test stops and starts again, never the shared one."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from tests._cluster import private_cluster  # noqa: F401 - the fixture `cluster`
from tests._pg import TempCluster
from veracity.maintenance._loop import Service
from veracity.maintenance.reconciler import ReconcilerMetrics, ReconcilerService
from veracity.maintenance.recovery import RecoveryMetrics, RecoveryService
from veracity.store import open_store


def ticks(registry: CollectorRegistry, service: str, outcome: str) -> float:
    value = registry.get_sample_value(f"veracity_{service}_ticks_total", {"outcome": outcome})
    return value or 0.0


async def test_a_tick_without_a_database_is_counted_as_an_error(cluster: TempCluster) -> None:
    store = await open_store(cluster.url, pool_size=1)
    try:
        await store.migrate()
        registry = CollectorRegistry()
        services: dict[str, Service] = {
            "reconciler": ReconcilerService(store, {}, {}, metrics=ReconcilerMetrics(registry)),
            "recovery": RecoveryService(store, metrics=RecoveryMetrics(registry)),
        }
        for name, service in services.items():
            await service.run_once()
            assert (ticks(registry, name, "ran"), ticks(registry, name, "error")) == (1, 0)

        cluster.halt()
        try:
            for name, service in services.items():
                with pytest.raises(psycopg.OperationalError):
                    await service.run_once()
                assert ticks(registry, name, "error") == 1, name
                assert ticks(registry, name, "ran") == 1, name
        finally:
            cluster.resume()

        # the database is back: the next tick runs as usual
        for name, service in services.items():
            await service.run_once()
            assert (ticks(registry, name, "ran"), ticks(registry, name, "error")) == (2, 1)
    finally:
        await store.close()
