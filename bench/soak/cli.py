"""The soak's command line. Bad arguments (a seed that is not a whole number, ...) exit 2
with a message before anything is started; violations exit 1."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.soak import schedule as sch
from bench.soak.rig import Settings


def seed(text: str) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a soak seed is a whole number (e.g. 42), not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a soak seed is not negative, not {text!r}")
    return value


def _number(what: str, low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} is a number, not {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} is from {low:g} to {high:g}, not {text}")
        return value
    return parse


def _count(what: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} is a whole number, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} is from {low} to {high}, not {text}")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="The seeded fault soak: a mixed workload on PostgreSQL with workers "
        "killed, stopped and disconnected, the database restarted and the fake n8n "
        "misbehaving; then an invariant check. Exits 1 if it finds a violation.")
    p.add_argument("--seed", type=seed, default=1,
                   help="the seed of the fault schedule and the workload (default 1)")
    p.add_argument("--minutes", type=_number("--minutes", 0.5, 24 * 60), default=10.0,
                   help="how long the workload and the faults run, before the drain "
                   "(default 10)")
    p.add_argument("--workers", type=_count("--workers", 1, 8), default=3,
                   help="veracity worker processes (default 3)")
    p.add_argument("--rate", type=_number("--rate", 0.1, 50), default=2.0,
                   help="top-level submissions a second, on average (default 2)")
    p.add_argument("--settle", type=_number("--settle", 10, 3600), default=180.0,
                   help="at most this many seconds for the drain (default 180)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="folder for logs, marks and the figures (default: a new temporary "
                   "folder)")
    p.add_argument("--json", type=Path, default=None, dest="json_path",
                   help="where to write the figures as JSON (default: soak.json in the "
                   "work folder)")
    p.add_argument("--schedule-only", action="store_true",
                   help="print the fault schedule of this seed and exit")
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.schedule_only:
        settings = Settings(workers=args.workers)
        timings = sch.Timings(settings.lease_ttl, settings.engine_timeout)
        print(sch.describe_schedule(sch.fault_schedule(args.seed, args.minutes * 60,
                                                       args.workers, timings)))
        return
    from bench.soak.run import Options, run

    # SIGTERM stops the soak as Ctrl-C does: its processes and its cluster are cleaned up
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        figures = run(Options(seed=args.seed, minutes=args.minutes, workers=args.workers,
                              rate=args.rate, settle=args.settle, folder=args.workdir,
                              json_path=args.json_path))
    except KeyboardInterrupt:
        print("soak interrupted: its processes and its cluster were stopped", file=sys.stderr)
        sys.exit(130)
    sys.exit(1 if figures["violations"] else 0)
