"""The seeded fault soak (bench/soak), two minutes of it with a fixed seed: a mixed workload
on a private PostgreSQL cluster, a server and two workers, with every kind of fault of the
schedule injected at least once; after the drain the invariant checker finds no violation.
(`make soak` runs ten minutes; bench/README.md has the figures of such a run.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from bench.soak.schedule import KINDS

from tests import _soak
from tests._needs import missing
from tests._pg import find_pg_bin_dir

TIMEOUT = 780.0


@pytest.mark.timeout(900)
def test_a_two_minute_soak_breaks_no_guarantee(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Under xdist the soak runs in the background from the start of the run and this test,
    started last, collects its result (tests/_soak.py); otherwise it runs the soak itself."""
    if find_pg_bin_dir() is None:
        missing("PostgreSQL's server binaries (initdb, pg_ctl) are needed for the soak's "
                "private cluster")
    background = _background_folder(request.config)
    if background is not None:  # started by the xdist controller (tests/_soak.py)
        folder = background
        deadline = time.monotonic() + TIMEOUT
        while (done := _soak.finished(folder)) is None:
            assert time.monotonic() < deadline, f"the soak did not end within {TIMEOUT:g} s"
            time.sleep(0.5)
    else:
        folder = tmp_path
        done = _soak.run_here(folder, TIMEOUT)
    report = folder / "soak.json"
    output = f"{done.stdout[-6000:]}\n{done.stderr[-4000:]}"
    assert report.exists(), output
    figures = json.loads(report.read_text())

    assert figures["violations"] == [], output
    assert done.returncode == 0, output
    # the soak did what it says: a workload that ran to the end, and every kind of fault
    executions = figures["executions"]
    assert executions["submitted"] > 150, output
    assert executions["acknowledged"] == executions["submitted"], output
    assert executions["children"] > 0, output
    assert sum(executions["by_status"].values()) == executions["total"], output
    assert set(executions["by_status"]) <= {"completed", "failed", "failed_transient",
                                            "cancelled"}, output
    assert figures["steps"]["checkpointed"] > 500, output
    assert figures["engine"]["runs"] > 30, output
    faults = figures["faults"]["by_kind"]
    assert set(faults) == set(KINDS)
    for kind, counts in faults.items():
        assert counts.get("injected", 0) >= 1 and not counts.get("failed"), (kind, output)


def _background_folder(config: pytest.Config) -> Path | None:
    """The folder of the soak the xdist controller started for this run, if it did."""
    if not hasattr(config, "workerinput") or config.option.basetemp is None:
        return None
    folder = Path(config.option.basetemp).parent / _soak.FOLDER
    return folder if folder.is_dir() else None
