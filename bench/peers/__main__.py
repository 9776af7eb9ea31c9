"""``python -m bench.peers`` (``make bench-peers``): the same workloads on Veracity at its
defaults, PGQueuer, Procrastinate, DBOS (default polling and 10 ms) and a plain-SQL
SKIP LOCKED queue (the ceiling), each in its own scratch database on one PostgreSQL,
interleaved (round 1 of every system, then round 2, ...), median of the rounds.

Workloads (one fresh database each):
- enqueue: ``--jobs`` jobs submitted one call at a time by one client; jobs/s.
- enqueue, ``--callers`` at once: ``--jobs`` jobs, each caller (a task of one process)
  submitting its share one call at a time; jobs/s.
- no-op 1 / 2 workers: those jobs, then 1 (or 2) worker processes started together
  (``held``: the harness locks the system's job table, starts the workers, and releases the
  lock once each has a connection waiting for it, so that their start-ups are behind them
  and two workers start draining at the same moment); the harness counts the jobs left
  every 10 ms (``DRAIN_POLL``). The table's jobs/s is the steady
  rate: the jobs finished between the first count at or under 90 % of them left and the
  first at or under 10 %, over that time. The whole drain's rate (from the first count
  that saw one finished to the one that saw none left), which the table gave until
  2026-12-06, is listed under it with each round's figures: it counts each system's
  ramp-up, which a drain of 2,000 jobs made most of PGQueuer's (its whole-drain rate
  rose from 1,255/s at 2,000 jobs to 2,123/s at 5,000 and 2,343/s at 10,000; two workers
  1,392, 2,629 and 3,864/s).
- CPU a no-op job, 1 worker: the CPU time of the worker process and of the database's
  backends serving that system's database (``/proc``; the harness's own connection and
  PostgreSQL's shared background processes left out, for every system alike), from the
  first count that saw a job finished to the one that saw none left, over the jobs
  finished between them: what a job costs the machine, which moves less with the
  machine's speed than a rate does.
- submit-to-start: one idle worker, ``--samples`` jobs one at a time 20 ms apart; the job's
  start mark (``time.time()`` in the worker) minus the submitter's time before the call.
- 3-step workflows: ``--steps-jobs`` workflows of three checkpointed steps, one worker;
  the steady rate, as above; n/a for systems without steps.
- kill -9: 16 jobs of 2 s on one worker (lease / heartbeat / stalled threshold 5 s), the
  worker killed with SIGKILL once all have started, a replacement started at once; the
  time from the kill to none left; duplicates (a job finished twice) and losses (never
  finished) from the jobs' done marks.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench._util import backend_cpu_seconds, process_cpu, scratch_pg_database
from bench.peers.jobs import read_marks
from bench.peers.systems import SYSTEMS, System

RECOVERY_JOBS = 16


@contextmanager
def workers(system: System, url: str, n: int, job: str, recovery: bool = False,
            marks: str = "") -> Iterator[list[subprocess.Popen[bytes]]]:
    argv, env = system.worker_argv(url, job, recovery)
    if marks:
        env["BENCH_MARKS"] = marks
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


HOLD_TIMEOUT = 30.0
"""Seconds ``held`` waits for every worker to wait on the job table before it releases
the lock anyway (and says so)."""


@contextmanager
def held(system: System, url: str
         ) -> Iterator[Callable[[Sequence[subprocess.Popen[bytes]]], bool]]:
    """While open, the system's job table is locked (``ACCESS EXCLUSIVE``): a worker started
    meanwhile stops at its first read of it. ``release(procs)`` waits until each of the
    worker processes ``procs`` has a connection waiting for that lock (at most
    ``HOLD_TIMEOUT``), then releases it, and says whether they all were waiting. The
    drain that follows measures workers that start together, their imports and
    connections behind them, for every system alike: a drain of 2,000 no-ops lasts a
    fifth of a second for Veracity, less than the spread of two processes' start-ups."""
    table = sql.Identifier(*system.table.split("."))
    with psycopg.connect(url) as lock, psycopg.connect(url, autocommit=True) as watch:
        lock.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))

        def release(procs: Sequence[subprocess.Popen[bytes]]) -> bool:
            deadline = time.monotonic() + HOLD_TIMEOUT
            ready = False
            while not ready and time.monotonic() < deadline:
                waiting = {int(r[0]) for r in watch.execute(
                    "SELECT a.client_port FROM pg_locks AS l JOIN pg_stat_activity AS a"
                    " ON a.pid = l.pid WHERE l.relation = %s::regclass AND NOT l.granted"
                    " AND a.client_port IS NOT NULL", [system.table]).fetchall()}
                ready = all(local_ports(p.pid) & waiting for p in procs)
                if not ready:
                    time.sleep(DRAIN_POLL)
            lock.commit()
            return ready

        yield release


def local_ports(pid: int) -> set[int]:
    """The local ports of a process's TCP sockets (Linux ``/proc``): matched against
    ``pg_stat_activity.client_port``, they name the process behind a backend."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # it exited
        return set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def remaining(conn: psycopg.Connection[tuple[int]], system: System) -> int:
    row = conn.execute(system.remaining_sql).fetchone()
    assert row is not None
    return int(row[0])


DRAIN_POLL = 0.01
"""Seconds between the drain's counts of the jobs left: the rate's end is known to within
this. Each count reads at most ``--jobs`` rows: Veracity's took 0.41 ms (median of 200,
round trip included) at 2,000 rows, so the polls cost the database a few percent of a
core, as much for every system."""


Drain = tuple[float | None, float | None, float | None]
"""A drain's (whole, steady) jobs/s and its CPU a job (see :func:`drain`)."""


def drain(system: System, url: str, n: int, procs: Sequence[subprocess.Popen[bytes]] = (),
          timeout: float = 120) -> Drain:
    """(whole, steady) jobs/s while draining ``n`` jobs (see the module's doc), and the CPU
    seconds a job of the worker processes ``procs`` and of the database's backends serving
    them; None if not all finished. Whole: from the first poll that saw one finished to
    the poll that saw none left. Steady: from the first poll that saw at most 90 % left to
    the first that saw at most 10 % left, the jobs finished between them over that time.
    CPU: from that first poll that saw one finished (the processes' start-up mostly behind
    them) to the last, over the jobs finished between them."""
    samples: list[tuple[float, int]] = []
    first: tuple[int, dict[tuple[str, int], float]] | None = None
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = remaining(conn, system)
            samples.append((time.monotonic(), left))
            if first is None and left < n:
                first = (left, cpu_now(conn, procs))
            if left == 0:
                cpu = None
                if first is not None and first[0] > 0:
                    end = cpu_now(conn, procs)
                    cpu = sum(v - first[1].get(k, 0.0) for k, v in end.items()) / first[0]
                return (*rates(samples, n), cpu)
            time.sleep(DRAIN_POLL)
    return None, None, None


def cpu_now(conn: psycopg.Connection[Any], procs: Sequence[subprocess.Popen[bytes]]
            ) -> dict[tuple[str, int], float]:
    """CPU seconds so far of each worker process and of each backend of the connection's
    database but its own (the harness's polls), by ("worker" or "db", pid). PostgreSQL's
    shared background processes (WAL writer, checkpointer, autovacuum) are left out, for
    every system alike."""
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()").fetchall()
    out = {("db", int(r[0])): backend_cpu_seconds(int(r[0])) for r in rows}
    out.update({("worker", p.pid): process_cpu(p.pid) for p in procs})
    return out


def rates(samples: list[tuple[float, int]], n: int) -> tuple[float | None, float | None]:
    """(whole, steady) jobs/s from a drain's polls ``(time, jobs left)`` (see :func:`drain`)."""
    def first(at_most: float) -> tuple[float, int] | None:
        return next(((t, left) for t, left in samples if left <= at_most), None)

    def rate(a: tuple[float, int] | None, b: tuple[float, int] | None) -> float | None:
        if a is None or b is None or b[0] <= a[0]:
            return None
        return (a[1] - b[1]) / (b[0] - a[0])

    return rate(first(n - 1), first(0)), rate(first(0.9 * n), first(0.1 * n))


async def submit_all(system: System, url: str, items: list[tuple[str, str]],
                     gap: float = 0.0, callers: int = 1) -> tuple[float, dict[str, float]]:
    """(jobs/s, {key: time before its call}): ``callers`` tasks at once, each submitting
    its share one call at a time."""
    sent: dict[str, float] = {}
    async with system.submitter(url, items[0][0], callers) as submit:
        # a no-op for the slow jobs of the kill -9 workload: 16 slow jobs in flight at the
        # kill, not 17 for systems that run 16 at once
        await submit("noop" if items[0][0] == "slow" else items[0][0], "warm-up")

        async def caller(share: list[tuple[str, str]]) -> None:
            for kind, key in share:
                sent[key] = time.time()
                await submit(kind, key)
                if gap:
                    await asyncio.sleep(gap)

        began = time.perf_counter()
        await asyncio.gather(*(caller(items[i::callers]) for i in range(callers)))
        elapsed = time.perf_counter() - began
    return len(items) / elapsed, sent


def fresh(system: System) -> Iterator[str]:
    with scratch_pg_database() as url:
        asyncio.run(system.setup(url))
        yield url


def throughput(system: System, n: int, procs: int, job: str = "noop"
               ) -> tuple[float, Drain]:
    """(enqueue jobs/s, (whole jobs/s, steady jobs/s, CPU a job) of the drain)."""
    for url in fresh(system):
        rate, _ = asyncio.run(submit_all(system, url, [(job, f"k{i}") for i in range(n)]))
        # the warm-up job counts too
        with held(system, url) as release, workers(system, url, procs, job) as started:
            if not release(started):
                print(f"# {system.name}, {procs} worker(s): not every worker waited on the "
                      f"job table within {HOLD_TIMEOUT:g} s; released anyway", flush=True)
            return rate, drain(system, url, n + 1, started)
    raise AssertionError


def enqueue_at_once(system: System, n: int, callers: int) -> float:
    """Jobs/s of ``n`` single submissions by ``callers`` callers at once."""
    for url in fresh(system):
        rate, _ = asyncio.run(submit_all(system, url, [("noop", f"k{i}") for i in range(n)],
                                         callers=callers))
        return rate
    raise AssertionError


def latency(system: System, samples: int) -> tuple[float, float, int]:
    for url in fresh(system):
        with tempfile.TemporaryDirectory() as tmp:
            marks = os.path.join(tmp, "marks")
            with workers(system, url, 1, "mark", marks=marks):
                time.sleep(3.0)  # started and idle
                _, sent = asyncio.run(submit_all(
                    system, url, [("mark", f"k{i}") for i in range(samples)], gap=0.02))
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    started = read_marks(marks)["start"]
                    if all(k in started for k in sent):
                        break
                    time.sleep(0.1)
            started = read_marks(marks)["start"]
            values = sorted((started[k][0] - t) * 1000 for k, t in sent.items() if k in started)
            q = statistics.quantiles(values, n=100, method="inclusive")
            return q[49], q[98], samples - len(values)
    raise AssertionError


def recovery(system: System) -> tuple[float | None, int, int]:
    """(seconds from the kill to none left, duplicates, losses)."""
    for url in fresh(system):
        with tempfile.TemporaryDirectory() as tmp:
            marks = os.path.join(tmp, "marks")
            keys = [f"k{i}" for i in range(RECOVERY_JOBS)]
            asyncio.run(submit_all(system, url, [("slow", k) for k in keys]))
            with workers(system, url, 1, "slow", recovery=True, marks=marks) as (victim,):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    if all(k in read_marks(marks)["start"] for k in keys):
                        break
                    time.sleep(0.02)
                victim.send_signal(signal.SIGKILL)
                killed = time.monotonic()
            took: float | None = None
            with workers(system, url, 1, "slow", recovery=True, marks=marks), \
                    psycopg.connect(url, autocommit=True) as conn:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    if remaining(conn, system) == 0:
                        took = time.monotonic() - killed
                        break
                    time.sleep(0.05)
                time.sleep(SLOW_GRACE)
            done = read_marks(marks)["done"]
            done.pop("warm-up", None)
            dups = sum(1 for k in keys if len(done.get(k, [])) > 1)
            lost = sum(1 for k in keys if k not in done)
            return took, dups, lost
    raise AssertionError


SLOW_GRACE = 2.5  # after none is left, a redone job still running would mark itself done


WORKLOADS = ("throughput", "latency", "steps", "recovery")
"""``throughput``: enqueue and no-op with 1 and 2 workers; the others as named above."""


def fmt(values: list[float | None], unit: str = "") -> str:
    if not values:
        return "-"  # not run
    got = [v for v in values if v is not None]
    if not got:
        return "failed"
    text = (f"{statistics.median(got):.1f} s" if unit == " s" else
            f"{statistics.median(got):.3f} ms" if unit == " ms" else
            f"{statistics.median(got):,.0f}{unit}")
    if len(got) < len(values):
        text += f" ({len(values) - len(got)} of {len(values)} failed)"
    return text


def pair(res: dict[str, list[float | None]], what: str) -> str:
    """A drain's cell: the steady rate's median, then the whole drain's."""
    if not res.get(what):
        return "-"
    return f"{fmt(res[what])} / {fmt(res[what + '_whole'])}"


def total(values: list[float | None]) -> float:
    return float(sum(v for v in values if v is not None))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--steps-jobs", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--only", nargs="*", help="system kinds to run (default: all)")
    parser.add_argument("--workloads", nargs="*", choices=WORKLOADS, default=list(WORKLOADS),
                        help="workloads to run (default: all); the others show as '-'")
    args = parser.parse_args(argv)
    chosen = set(args.workloads)
    systems = [s for s in SYSTEMS if not args.only or s.kind in args.only]
    versions = []
    for dist in ("veracity", "pgqueuer", "procrastinate", "dbos"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} not installed")
    with psycopg.connect(os.environ.get("VERACITY_BENCH_DATABASE_URL",
                                        "postgresql://postgres@127.0.0.1:5432/postgres")) as c:
        row = c.execute("SHOW server_version").fetchone()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, PostgreSQL "
          f"{row[0] if row else '?'}; {', '.join(versions)}; load average "
          f"{os.getloadavg()[0]:.1f} at the start; {args.rounds} round(s), median")
    results: dict[str, dict[str, list[float | None]]] = {s.name: {} for s in systems}

    def add(system: System, what: str, value: float | None) -> None:
        results[system.name].setdefault(what, []).append(value)

    for r in range(args.rounds):
        for system in systems:
            started = time.monotonic()
            if "throughput" in chosen:
                enq, (whole1, rate1, cpu1) = throughput(system, args.jobs, 1)
                add(system, "enqueue", enq)
                add(system, "noop1", rate1)
                add(system, "noop1_whole", whole1)
                add(system, "cpu1", None if cpu1 is None else cpu1 * 1000)
                enq, (whole2, rate2, _) = throughput(system, args.jobs, 2)
                add(system, "enqueue", enq)
                add(system, "noop2", rate2)
                add(system, "noop2_whole", whole2)
                add(system, "enqueue_many", enqueue_at_once(system, args.jobs, args.callers))
            if "latency" in chosen:
                p50, p99, missed = latency(system, args.samples)
                add(system, "p50", p50)
                add(system, "p99", p99)
                add(system, "missed", float(missed))
            if system.has_steps and "steps" in chosen:
                _, (steps_whole, steps, _) = throughput(system, args.steps_jobs, 1,
                                                        job="steps")
                add(system, "steps", steps)
                add(system, "steps_whole", steps_whole)
            if "recovery" in chosen:
                took, dups, lost = recovery(system)
                add(system, "recovery", took)
                add(system, "dups", float(dups))
                add(system, "lost", float(lost))
            print(f"# round {r + 1} {system.name}: {time.monotonic() - started:.0f} s, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    print("| system | no-op jobs/s, 1 worker (steady / whole drain) | 2 workers (same) "
          "| CPU a no-op job, 1 worker (worker + database) "
          "| enqueue jobs/s (one call each) "
          f"| same, {args.callers} callers at once | submit-to-start p50 / p99 "
          "| 3-step workflows/s (steady / whole) | kill -9: kill to all done "
          "| duplicates / losses (kill -9, all rounds) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for system in systems:
        res = results[system.name]
        if "latency" in chosen:
            p50 = statistics.median(v for v in res["p50"] if v is not None)
            p99 = statistics.median(v for v in res["p99"] if v is not None)
            never = total(res["missed"])
            latency_text = (f"{p50:.2f} / {p99:.2f} ms"
                            f"{f' ({never:.0f} never started)' if never else ''}")
        else:
            latency_text = "-"
        steps_text = ("n/a (no steps)" if not system.has_steps
                      else pair(res, "steps") if "steps" in chosen else "-")
        recovery_text = ((fmt(res["recovery"], " s"), f"{total(res['dups']):.0f} / "
                          f"{total(res['lost']):.0f}") if "recovery" in chosen else ("-", "-"))
        print(f"| {system.name} | {pair(res, 'noop1')} | {pair(res, 'noop2')} | "
              f"{fmt(res.get('cpu1', []), ' ms')} | "
              f"{fmt(res.get('enqueue', []))} | {fmt(res.get('enqueue_many', []))} | "
              f"{latency_text} | {steps_text} | "
              f"{recovery_text[0]} | {recovery_text[1]} |")
    print()
    print("Each round's figures (the table gives their medians; noop and steps: the steady "
          "rate, _whole: the whole drain's; enqueue: two a round, before the one- and the "
          "two-worker drains):")
    for system in systems:
        res = results[system.name]
        parts = [f"{what} " + ", ".join("failed" if v is None else f"{v:,.{digits}f}"
                                         for v in res[what])
                 for what, digits in (("noop1", 0), ("noop1_whole", 0), ("noop2", 0),
                                      ("noop2_whole", 0), ("cpu1", 3), ("enqueue", 0),
                                      ("enqueue_many", 0), ("p50", 2), ("p99", 2),
                                      ("steps", 0), ("steps_whole", 0), ("recovery", 1))
                 if res.get(what)]
        print(f"- {system.name}: {'; '.join(parts)}")

if __name__ == "__main__":
    main()
