"""Cron on PostgreSQL: 1,000 ``[[cron]]`` entries firing every second (``* * * * * *``),
run by two ``veracity server`` processes on one scratch database for a minute.

Set-up (not measured): a ``veracity.toml`` with the entries (each starts
``shop:mail/send.run`` of the example app with two parameters), two servers started with
it (``--no-worker``, as on PostgreSQL by default: the executions stay pending, so only
cron's own work is measured), log level ``warning`` (at ``info`` each slot started is a
JSON log line: 1,000 lines a second per server). Once both answer ``/healthz``, the
measured window is the ``--seconds`` whole seconds (default 60) that start two seconds
later by the database's clock; the servers keep running until 5 s after the window ends,
then get SIGTERM.

Measured afterwards from the database alone, for the slots in the window:

- duplicates: (entry, slot) pairs with more than one execution, read from each execution's
  ``pending`` event (``data.cron.name``, ``data.cron.slot``), and executions whose
  ``scheduled_at`` is not their event's slot;
- missed: entry-seconds of the window without an execution (1,000 times the seconds expected);
- lateness: each slot's ``fired_at`` (the starting transaction's ``now()``) minus its
  slot time: p50, p99, max;

and from each server just before the stop: slots it started and slots it found started by
the other (``veracity_cron_slots_fired_total``, ``veracity_cron_slots_taken_total``, all
ticks, not only the window's), its ticks and their mean duration, and the CPU seconds it
used (``/proc/<pid>/stat``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import psycopg

from bench._util import free_port, scratch_pg_database, veracity_bin

APP = "veracity.examples.shop:app"
FFQN = "shop:mail/send.run"


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    stderr: Path

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> dict[str, float]:
        """Each metric's samples summed over their labels."""
        totals: dict[str, float] = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if 'outcome="error"' in line:
                name += ":error"
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return totals


def write_config(folder: Path, entries: int) -> Path:
    lines = []
    for i in range(entries):
        lines += ["[[cron]]", f'name = "c{i:04d}"', f'ffqn = "{FFQN}"',
                  'schedule = "* * * * * *"', f'params = ["ops-{i}@example.com", "tick"]', ""]
    path = folder / "veracity.toml"
    path.write_text("\n".join(lines))
    return path


@contextmanager
def server(url: str, config: Path, folder: Path, name: str) -> Iterator[Server]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env.update(VERACITY_DATABASE_URL=url, VERACITY_APP=APP, VERACITY_PORT=str(port),
               VERACITY_CONFIG=str(config), VERACITY_LOG_LEVEL="warning")
    err = folder / f"{name}.stderr"
    with err.open("wb") as stderr:
        proc = subprocess.Popen([veracity_bin(), "server", "--no-worker"], env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    s = Server(proc, f"http://127.0.0.1:{port}", err)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{s.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start: {err.read_text()[-2000:]}")
            time.sleep(0.1)
        yield s
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def db_now(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def run(entries: int, seconds: int) -> None:
    with scratch_pg_database() as url, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_config(folder, entries)
        with ExitStack() as stack:
            servers = [stack.enter_context(server(url, config, folder, name))
                       for name in ("a", "b")]
            up = db_now(url)
            start = up.replace(microsecond=0) + timedelta(seconds=2)
            end = start + timedelta(seconds=seconds)  # the window is [start, end)
            while db_now(url) < end + timedelta(seconds=5):
                time.sleep(0.5)
            cpu = [s.cpu_seconds() for s in servers]
            metrics = [s.metrics() for s in servers]
            for s in servers:
                s.proc.send_signal(signal.SIGTERM)
            for s in servers:
                if s.proc.wait(timeout=60) != 0:
                    print(f"cron  a server exited with {s.proc.returncode}: "
                          f"{s.stderr.read_text()[-2000:]}")
        report(url, entries, seconds, start, end, cpu, metrics)


def report(url: str, entries: int, seconds: int, start: datetime, end: datetime,
           cpu: list[float], metrics: list[dict[str, float]]) -> None:
    window = {"start": start, "end": end}
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """SELECT h.data->'cron'->>'name', (h.data->'cron'->>'slot')::timestamptz,
                      e.scheduled_at
               FROM veracity_executions AS e
               JOIN veracity_history AS h ON h.execution_id = e.id AND h.seq = 1
               WHERE (h.data->'cron'->>'slot')::timestamptz >= %(start)s
                 AND (h.data->'cron'->>'slot')::timestamptz < %(end)s""", window).fetchall()
        late = conn.execute(
            """SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY f),
                      percentile_cont(0.99) WITHIN GROUP (ORDER BY f), max(f), count(*)
               FROM (SELECT extract(epoch FROM fired_at - slot_at) AS f
                     FROM veracity_cron_slots
                     WHERE slot_at >= %(start)s AND slot_at < %(end)s) AS s""",
            window).fetchone()
        total = conn.execute("SELECT count(*) FROM veracity_executions").fetchone()
    assert late is not None and total is not None
    seen: dict[tuple[str, datetime], int] = {}
    wrong_time = 0
    for name, slot, scheduled in rows:
        seen[(name, slot)] = seen.get((name, slot), 0) + 1
        wrong_time += scheduled != slot
    duplicates = sum(1 for n in seen.values() if n > 1)
    expected = entries * seconds
    missed = expected - len(seen)
    print(f"cron  postgresql  {entries:,} entries every second, 2 servers, {seconds} s "
          f"({start:%H:%M:%S}..{end:%H:%M:%S} UTC): {len(rows):,} executions for "
          f"{expected:,} entry-seconds: {duplicates} duplicates, {missed} missed, "
          f"{wrong_time} with a wrong scheduled_at ({total[0]:,} executions in all)")
    p50, p99, worst, count = late
    print(f"cron  postgresql  lateness of the window's {count:,} slots (fired_at - slot): "
          f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms")
    for name, m, used in zip("ab", metrics, cpu, strict=True):
        ticks = m.get("veracity_cron_ticks_total", 0.0)  # ran (the failed ones apart)
        mean = m.get("veracity_cron_tick_duration_seconds_sum", 0.0) / max(
            m.get("veracity_cron_tick_duration_seconds_count", 0.0), 1.0)
        print(f"cron  postgresql  server {name}: started "
              f"{m.get('veracity_cron_slots_fired_total', 0):,.0f} slots, found "
              f"{m.get('veracity_cron_slots_taken_total', 0):,.0f} started by the other, "
              f"{ticks:,.0f} ticks ({m.get('veracity_cron_ticks_total:error', 0):,.0f} failed)"
              f", mean tick {mean * 1000:.0f} ms, {used:.1f} s CPU")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args(argv)
    run(args.entries, args.seconds)


if __name__ == "__main__":
    main()
