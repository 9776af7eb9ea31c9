"""The soak's fault schedule: a pure function of the seed, the length of the soak and the
number of workers (:func:`fault_schedule`), so one seed reproduces the same faults.

Faults of one target never overlap (a worker is not killed while it is stopped, the engine
is not hung while it is down); faults of different targets may. Every kind appears at least
once when the soak is long enough; the rest are drawn at random intervals.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any

WORKER_KILL = "worker_kill"
"""SIGKILL a worker; a new worker process takes its place ``seconds`` later."""
WORKER_STOP = "worker_stop"
"""SIGSTOP a worker for ``seconds`` (longer than the lease TTL), then SIGCONT."""
DB_TERMINATE = "db_terminate"
"""pg_terminate_backend on every database connection of the target process."""
PG_RESTART = "pg_restart"
"""Stop the private PostgreSQL cluster (fast shutdown) for ``seconds``, then start it."""
ENGINE_CRASH = "engine_crash"
"""The fake n8n dies (its runs stop) for ``seconds``; it comes back answering n8n's start-up
404 for ``starting_for`` seconds."""
ENGINE_HANG = "engine_hang"
"""For ``seconds``, every engine request is answered only after ``latency`` seconds, longer
than Veracity's timeouts."""
ENGINE_5XX = "engine_5xx"
"""For ``seconds``, the execution API answers ``status`` for every run going."""
CALLBACKS_LOSE = "callbacks_lose"
"""For ``seconds``, runs going never call back."""
CALLBACKS_DUPLICATE = "callbacks_duplicate"
"""For ``seconds``, runs going call back twice."""

KINDS: tuple[str, ...] = (
    WORKER_KILL, WORKER_STOP, DB_TERMINATE, PG_RESTART, ENGINE_CRASH, ENGINE_HANG,
    ENGINE_5XX, CALLBACKS_LOSE, CALLBACKS_DUPLICATE,
)
_WEIGHTS: dict[str, float] = {
    WORKER_KILL: 3, WORKER_STOP: 3, DB_TERMINATE: 3, PG_RESTART: 1, ENGINE_CRASH: 1.5,
    ENGINE_HANG: 1.5, ENGINE_5XX: 2, CALLBACKS_LOSE: 2, CALLBACKS_DUPLICATE: 2,
}
POSTGRES = "postgres"
ENGINE = "engine"
"""The target of every engine fault: one at a time, whatever its kind."""
SERVER = "server"


def worker_name(index: int) -> str:
    return f"worker-{index}"


@dataclass(frozen=True)
class Fault:
    """One fault: when (seconds from the soak's start), what, on which target, for how long,
    with the kind's own parameter (``latency``, ``status`` or ``starting_for``) if any."""

    at: float
    kind: str
    target: str
    seconds: float
    param: float | None = None

    def describe(self) -> str:
        extra = ""
        if self.kind == ENGINE_HANG:
            extra = f", answers after {self.param:g} s"
        elif self.kind == ENGINE_5XX:
            extra = f", status {int(self.param or 0)}"
        elif self.kind == ENGINE_CRASH:
            extra = f", then starting up for {self.param:g} s"
        length = "" if self.kind == DB_TERMINATE else f" for {self.seconds:g} s"
        return f"{self.at:7.1f} s  {self.kind:<19} {self.target:<9}{length}{extra}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Timings:
    """What the faults' lengths are measured against."""

    lease_ttl: float
    engine_timeout: float


def _draw(rng: random.Random, kind: str, at: float, workers: int, t: Timings) -> Fault:
    if kind == WORKER_KILL:
        return Fault(at, kind, worker_name(rng.randrange(workers)),
                     round(rng.uniform(1.0, 6.0), 1))
    if kind == WORKER_STOP:
        return Fault(at, kind, worker_name(rng.randrange(workers)),
                     round(t.lease_ttl + rng.uniform(1.0, 5.0), 1))
    if kind == DB_TERMINATE:
        target = rng.choice([SERVER, *(worker_name(i) for i in range(workers))])
        return Fault(at, kind, target, 0.0)
    if kind == PG_RESTART:
        return Fault(at, kind, POSTGRES, round(rng.uniform(1.0, 8.0), 1))
    if kind == ENGINE_CRASH:
        return Fault(at, kind, ENGINE, round(rng.uniform(1.0, 6.0), 1),
                     round(rng.uniform(0.0, 4.0), 1))
    if kind == ENGINE_HANG:
        return Fault(at, kind, ENGINE, round(rng.uniform(3.0, 10.0), 1),
                     round(t.engine_timeout + rng.uniform(0.5, 2.0), 1))
    if kind == ENGINE_5XX:
        return Fault(at, kind, ENGINE, round(rng.uniform(2.0, 10.0), 1),
                     float(rng.choice([500, 502, 503])))
    if kind in (CALLBACKS_LOSE, CALLBACKS_DUPLICATE):
        return Fault(at, kind, ENGINE, round(rng.uniform(3.0, 12.0), 1))
    raise ValueError(f"unknown fault kind {kind!r}")


def _span(fault: Fault) -> float:
    # a target is busy for the fault's length plus a moment to come back
    return fault.seconds + 1.0


def _resources(fault: Fault) -> tuple[str, ...]:
    if fault.kind == DB_TERMINATE:
        # connections can only be ended while the database is up
        return (fault.target, POSTGRES)
    return (fault.target,)


def _earliest(fault: Fault, busy: dict[str, list[tuple[float, float]]]) -> float:
    """The earliest time from ``fault.at`` when none of its resources is busy for its span."""
    at = fault.at
    moved = True
    while moved:
        moved = False
        for resource in _resources(fault):
            for start, stop in busy.get(resource, []):
                if at < stop and start < at + _span(fault):
                    at, moved = stop, True
    return at


def fault_schedule(seed: int, seconds: float, workers: int, timings: Timings,
                   mean_gap: float = 6.0) -> list[Fault]:
    """The faults of a soak of ``seconds`` with ``workers`` workers, in order of time.

    Faults start from 5 s in (the processes are up) until 10 s before the end (the last
    ones are over before the soak drains). One of each kind is placed first, at a random
    time; then more, ``mean_gap`` seconds apart on average, their kinds drawn by weight. A
    fault whose target is busy then (one engine fault at a time; a connection cut only while
    the database is up) is moved to when it is free, or dropped if that is past the window.
    """
    if workers < 1:
        raise ValueError("at least one worker")
    rng = random.Random(seed)
    start, end = 5.0, seconds - 10.0
    if end <= start:
        return []
    wanted = sorted((rng.uniform(start, end), kind) for kind in KINDS)
    at = start
    kinds = list(_WEIGHTS)
    weights = [_WEIGHTS[k] for k in kinds]
    while True:
        at += rng.expovariate(1.0 / mean_gap)
        if at >= end:
            break
        wanted.append((at, rng.choices(kinds, weights)[0]))
    busy: dict[str, list[tuple[float, float]]] = {}
    out: list[Fault] = []
    for when, kind in wanted:
        fault = _draw(rng, kind, round(when, 1), workers, timings)
        free = round(_earliest(fault, busy), 1)
        if free >= end:
            continue
        fault = replace(fault, at=free)
        for resource in _resources(fault):
            busy.setdefault(resource, []).append((fault.at, fault.at + _span(fault)))
        out.append(fault)
    out.sort(key=lambda f: (f.at, f.kind, f.target))
    return out


def describe_schedule(faults: list[Fault]) -> str:
    lines = [f"fault schedule: {len(faults)} faults"]
    lines += ["  " + f.describe() for f in faults]
    return "\n".join(lines)
