"""The seeded fault soak (bench/soak), two minutes of it with a fixed seed: a mixed workload
on a private PostgreSQL cluster, a server and two workers, with every kind of fault of the
schedule injected at least once; after the drain the invariant checker finds no violation.
(`make soak` runs ten minutes; bench/README.md has the figures of such a run.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench.soak.schedule import KINDS

from tests._needs import missing
from tests._pg import find_pg_bin_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED = 2024
MINUTES = 2


@pytest.mark.slow  # no other slow test beside it; the quick ones go on
@pytest.mark.timeout(900)
def test_a_two_minute_soak_breaks_no_guarantee(tmp_path: Path) -> None:
    if find_pg_bin_dir() is None:
        missing("PostgreSQL's server binaries (initdb, pg_ctl) are needed for the soak's "
                "private cluster")
    report = tmp_path / "soak.json"
    soak = subprocess.Popen(
        [sys.executable, "-m", "bench.soak", "--seed", str(SEED), "--minutes", str(MINUTES),
         "--workers", "2", "--workdir", str(tmp_path / "soak"), "--json", str(report)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = soak.communicate(timeout=780)
    except subprocess.TimeoutExpired:
        soak.terminate()  # it stops its processes and its cluster, as on Ctrl-C
        stdout, stderr = soak.communicate(timeout=60)
        pytest.fail(f"the soak did not end within 13 minutes:\n{stdout[-6000:]}\n"
                    f"{stderr[-4000:]}")
    output = f"{stdout[-6000:]}\n{stderr[-4000:]}"
    assert report.exists(), output
    figures = json.loads(report.read_text())

    assert figures["violations"] == [], output
    assert soak.returncode == 0, output
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
