"""A private PostgreSQL cluster for a test that stops and starts its database (outages,
error ticks): initdb'd in a temporary folder on a free port, never the shared server.
Import ``private_cluster`` into a test module to have the fixture ``cluster`` there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._needs import missing
from tests._pg import ClusterError, TempCluster, find_pg_bin_dir


@pytest.fixture(name="cluster")
def private_cluster() -> Iterator[TempCluster]:
    if find_pg_bin_dir() is None:
        missing("PostgreSQL's server binaries (initdb, pg_ctl) are needed for a private cluster")
    c = TempCluster()
    try:
        c.start()
    except ClusterError as exc:
        missing(f"a private PostgreSQL cluster could not start: {exc}")
    try:
        yield c
    finally:
        c.stop()
