"""The soak's plan is a function of its seed (bench/soak/schedule.py, bench/soak/workload.py):
the same seed gives the same fault schedule and workload, another seed another; faults of one
target never overlap; and the command line refuses a seed that is not a number, starting
nothing."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

from bench.soak import schedule as sch
from bench.soak.workload import workload_plan

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMINGS = sch.Timings(lease_ttl=4.0, engine_timeout=3.0)


def test_one_seed_gives_one_schedule_and_another_seed_another() -> None:
    first = sch.fault_schedule(7, 120, 2, TIMINGS)
    again = sch.fault_schedule(7, 120, 2, TIMINGS)
    other = sch.fault_schedule(8, 120, 2, TIMINGS)

    assert first == again
    assert sch.describe_schedule(first) == sch.describe_schedule(again)
    assert first != other
    assert len(first) > len(sch.KINDS)


def test_one_seed_gives_one_workload_and_another_seed_another() -> None:
    first = workload_plan(7, 120, 2.0)
    assert first == workload_plan(7, 120, 2.0)
    assert first != workload_plan(8, 120, 2.0)
    assert len(first.submissions) > 100 and first.actions


def test_every_kind_is_in_a_two_minute_schedule_and_each_target_has_one_fault_at_a_time(
) -> None:
    for seed in range(20):
        faults = sch.fault_schedule(seed, 120, 2, TIMINGS)
        assert {f.kind for f in faults} == set(sch.KINDS), seed
        by_target: dict[str, list[sch.Fault]] = {}
        for fault in faults:
            assert 5.0 <= fault.at < 110.0, fault
            by_target.setdefault(fault.target, []).append(fault)
            if fault.kind == sch.WORKER_STOP:
                assert fault.seconds > TIMINGS.lease_ttl, fault  # stopped past its lease
            if fault.kind == sch.ENGINE_HANG:
                assert fault.param is not None and fault.param > TIMINGS.engine_timeout
        for target, own in by_target.items():
            for before, after in itertools.pairwise(own):
                assert after.at >= before.at + before.seconds, (target, before, after)
        restarts = [f for f in faults if f.kind == sch.PG_RESTART]
        for cut in (f for f in faults if f.kind == sch.DB_TERMINATE):
            assert not any(r.at <= cut.at < r.at + r.seconds for r in restarts), cut


def soak_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.soak", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_command_line_prints_the_same_schedule_for_one_seed() -> None:
    first = soak_cli("--seed", "11", "--minutes", "2", "--schedule-only")
    again = soak_cli("--seed", "11", "--minutes", "2", "--schedule-only")
    other = soak_cli("--seed", "12", "--minutes", "2", "--schedule-only")

    assert first.returncode == again.returncode == other.returncode == 0, first.stderr
    assert first.stdout.startswith("fault schedule: ")
    assert first.stdout == again.stdout
    assert first.stdout != other.stdout


def test_a_seed_that_is_not_a_number_is_refused_and_nothing_starts(tmp_path: Path) -> None:
    for bad in ("abc", "1.5", "", "-3"):
        workdir = tmp_path / f"soak-{bad or 'empty'}"
        done = soak_cli("--seed", bad, "--minutes", "0.5", "--workdir", str(workdir))
        assert done.returncode == 2, (bad, done.stdout, done.stderr)
        assert "argument --seed:" in done.stderr and "soak seed" in done.stderr, done.stderr
        assert done.stdout == ""  # no schedule printed, nothing started
        assert not workdir.exists()
