"""One soak: start the parts, run the workload and the fault schedule side by side, drain,
check, and report the figures.

**Drained** means, in order:

1. the last fault is over (the schedule ends 10 s before the workload does) and no new one
   starts; whatever a fault left broken is mended (a stopped worker continued, a dead one
   replaced, the engine up and prompt);
2. nothing more is submitted; an operator unpauses every paused execution and sends every
   planned message not sent yet;
3. the system settles for at most ``settle`` seconds, until every execution is terminal. A
   delegated execution whose trigger's outcome Veracity could not know (flagged
   ``no_external_id`` or ``trigger_unknown``: docs/external.md) waits for an operator by
   design; from 15 s into the drain an operator resolves each such flag older than 10 s
   as docs/external.md says to, from the engine's own records: ``attach`` the run the
   engine has for it, or ``fail`` it when the engine has none;
4. the processes are stopped and the checker (bench/soak/checker.py) reads the database,
   the marks and the fake engine's ground truth. An execution still not terminal then is a
   violation (``not_drained``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.soak import schedule as sch
from bench.soak.checker import Expected, Report, check
from bench.soak.rig import FaultRecord, Rig, Settings
from bench.soak.workload import Action, Plan, Submission, workload_plan

CALL_PATIENCE = 60.0
"""How long the workload keeps retrying one API call that meets 503s or transport errors."""
OPERATOR_AFTER = 15.0
FLAG_AGE = 10.0


@dataclass(frozen=True)
class Options:
    seed: int
    minutes: float
    workers: int = 3
    rate: float = 2.0
    settle: float = 180.0
    folder: Path | None = None
    json_path: Path | None = None


@dataclass
class Driver:
    """The workload's side: submits, acts as the operator, records what was acknowledged."""

    rig: Rig
    plan: Plan
    client: httpx.AsyncClient
    ids: dict[str, str | None] = field(default_factory=dict)
    expected: Expected = field(default_factory=Expected)
    answers: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    sent_messages: set[tuple[str, str]] = field(default_factory=set)
    limiter: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(16))

    async def call(self, method: str, path: str, body: Any = None,
                   what: str = "") -> httpx.Response | None:
        """One API call, retried through 503s, 5xx and transport errors for up to
        CALL_PATIENCE seconds; None if no answer came."""
        deadline = time.monotonic() + CALL_PATIENCE
        delay = 0.2
        while True:
            try:
                async with self.limiter:
                    response = await self.client.request(method, path, json=body)
                self.answers[f"{what} {response.status_code}"] += 1
                if response.status_code < 500:
                    return response
            except httpx.HTTPError as exc:
                self.answers[f"{what} {type(exc).__name__}"] += 1
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def submit(self, sub: Submission, seed: int) -> None:
        key = f"soak-{seed}-{sub.key}"
        self.expected.submissions[key] = None
        response = await self.call("POST", "/v1/executions", {
            "ffqn": sub.ffqn, "params": sub.params, "idempotency_key": key,
            "paused": sub.paused}, what="submit")
        if response is not None and response.status_code in (200, 201):
            ident = str(response.json()["id"])
            self.ids[sub.key] = ident
            self.expected.submissions[key] = ident
        else:
            self.ids[sub.key] = None

    async def act(self, action: Action) -> None:
        ident = self.ids.get(action.key)
        if ident is None:
            self.actions[f"{action.verb} skipped (not submitted)"] += 1
            return
        base = f"/v1/executions/{ident}"
        if action.verb == "message":
            self.sent_messages.add((action.key, str(action.topic)))
            response = await self.call("POST", f"{base}/messages",
                                       {"topic": action.topic, "payload": action.payload},
                                       what="message")
            if response is not None and response.status_code == 201:
                self.expected.messages[int(response.json()["message_id"])] = ident
        else:
            response = await self.call("PUT", f"{base}/{action.verb}", what=action.verb)
        status = response.status_code if response is not None else "no answer"
        self.actions[f"{action.verb} {status}"] += 1


async def _at(t0: float, at: float) -> None:
    delay = t0 + at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _run_workload(driver: Driver, seed: int, t0: float) -> None:
    tasks: list[asyncio.Task[None]] = []
    events: list[tuple[float, int, Submission | Action]] = [
        *((s.at, 0, s) for s in driver.plan.submissions),
        *((a.at, 1, a) for a in driver.plan.actions)]
    end = driver.plan.submissions[-1].at if driver.plan.submissions else 0.0
    for at, _, item in sorted(events, key=lambda e: (e[0], e[1])):
        if at > end + 0.01:
            break  # left to the drain
        await _at(t0, at)
        if isinstance(item, Submission):
            tasks.append(asyncio.create_task(driver.submit(item, seed)))
        else:
            tasks.append(asyncio.create_task(driver.act(item)))
    await asyncio.gather(*tasks)


async def _run_faults(rig: Rig, t0: float) -> None:
    tasks = []
    for record in rig.faults:
        await _at(t0, record.fault.at)
        rig.say(f"  {rig.now():7.1f} s  fault: {record.fault.describe().split('s ', 1)[1]}")
        tasks.append(asyncio.create_task(rig.inject(record)))
    await asyncio.gather(*tasks)


def _statuses(url: str) -> dict[str, int]:
    with psycopg.connect(url, connect_timeout=3) as conn:
        return {str(s): int(n) for s, n in conn.execute(
            "SELECT status, count(*) FROM veracity_executions GROUP BY status ORDER BY 1")}


async def _progress(rig: Rig, every: float = 30.0) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            counts = await asyncio.to_thread(_statuses, rig.database_url)
            text = ", ".join(f"{k} {v}" for k, v in counts.items())
        except psycopg.Error:
            text = "(database unavailable)"
        rig.say(f"  {rig.now():7.1f} s  executions: {text}")


async def _drain(driver: Driver, rig: Rig, settle: float) -> dict[str, Any]:
    rig.say(f"  {rig.now():7.1f} s  draining: " + (", ".join(rig.restore()) or "all up"))
    started = time.monotonic()
    url = rig.database_url
    # unpause every paused execution; send every planned message not sent yet
    with psycopg.connect(url) as conn:
        paused = [str(r[0]) for r in conn.execute(
            "SELECT id FROM veracity_executions WHERE status = 'paused'")]
    for ident in paused:
        response = await driver.call("PUT", f"/v1/executions/{ident}/unpause", what="unpause")
        driver.actions[f"drain unpause {response.status_code if response else 'no answer'}"] \
            += 1
    for action in driver.plan.actions:
        if action.verb == "message" and (action.key, str(action.topic)) not in \
                driver.sent_messages:
            await driver.act(action)
    operator: Counter[str] = Counter()
    deadline = started + settle
    left: int | None = None
    while time.monotonic() < deadline:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM veracity_executions WHERE status NOT IN "
                               "('completed', 'failed', 'failed_transient', 'cancelled')"
                               ).fetchone()
            left = int(row[0]) if row else 0
            if left == 0:
                break
            flagged = [] if time.monotonic() - started < OPERATOR_AFTER else [
                str(r[0]) for r in conn.execute(
                    "SELECT id FROM veracity_executions WHERE status = 'running' "
                    "AND engine IS NOT NULL AND external_execution_id IS NULL "
                    "AND flag_kind IN ('no_external_id', 'trigger_unknown') "
                    "AND flagged_at < now() - make_interval(secs => %s)", (FLAG_AGE,))]
        for ident in flagged:
            await _resolve(driver, rig, ident, operator)
        await asyncio.sleep(1.0)
    took = time.monotonic() - started
    rig.say(f"  {rig.now():7.1f} s  drained in {took:.1f} s; {left} not terminal"
            + (f"; operator: {dict(operator)}" if operator else ""))
    return {"seconds": round(took, 1), "not_terminal": left, "operator": dict(operator)}


async def _resolve(driver: Driver, rig: Rig, ident: str, operator: Counter[str]) -> None:
    assert rig.fake is not None
    runs = rig.fake.runs_for_execution(ident)
    if runs:
        body = {"action": "attach", "external_execution_id": runs[0].run_id,
                "reason": "soak drain: the engine has this run", "by": "soak"}
    else:
        body = {"action": "fail", "reason": "soak drain: the engine has no run for it",
                "by": "soak"}
    response = await driver.call("PUT", f"/v1/executions/{ident}/resolve", body,
                                 what="resolve")
    status = response.status_code if response is not None else "no answer"
    operator[f"{body['action']} {status}"] += 1


def _figures(options: Options, rig: Rig, driver: Driver, report: Report,
             drain: dict[str, Any], seconds: float) -> dict[str, Any]:
    statuses: dict[str, dict[str, int]] = {}
    for sub in driver.plan.submissions:
        statuses.setdefault(sub.kind, {})
    with psycopg.connect(rig.database_url) as conn:
        by_key = {str(k): str(s) for k, s in conn.execute(
            "SELECT idempotency_key, status FROM veracity_executions "
            "WHERE idempotency_key IS NOT NULL")}
    for sub in driver.plan.submissions:
        status = by_key.get(f"soak-{options.seed}-{sub.key}", "never acknowledged")
        statuses[sub.kind][status] = statuses[sub.kind].get(status, 0) + 1
    return {
        "seed": options.seed,
        "minutes": options.minutes,
        "workers": options.workers,
        "rate": options.rate,
        "settings": rig.settings.__dict__,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "drain": drain,
        "executions": {
            "submitted": len(driver.plan.submissions),
            "acknowledged": sum(1 for v in driver.expected.submissions.values() if v),
            "total": report.executions,
            "top_level": report.top_level,
            "children": report.children,
            "by_status": report.by_status,
            "submitted_by_kind": statuses,
            "by_workflow": report.by_ffqn,
            "flag_kinds": report.flagged,
        },
        "steps": {"checkpointed": report.steps_checkpointed,
                  "done_again_before_checkpoint": report.steps_redone,
                  "marks": report.marks},
        "engine": {"runs": report.engine_runs, "callbacks": report.callbacks},
        "reconciler_actions": rig.reconciler_actions(),
        "operator_actions": dict(sorted(driver.actions.items())),
        "api_answers": dict(sorted(driver.answers.items())),
        "faults": {
            "by_kind": rig.counts(),
            "injected": sum(1 for r in rig.faults if r.outcome == "injected"),
            "failed": sum(1 for r in rig.faults if r.outcome == "failed"),
            "schedule": [r.to_json() for r in rig.faults],
        },
        "violations": [v.to_json() for v in report.violations],
        "violation_histories": report.histories,
    }


def print_figures(fig: dict[str, Any]) -> None:
    ex = fig["executions"]
    print(f"\nsoak seed {fig['seed']}, {fig['minutes']:g} min, {fig['workers']} workers: "
          f"{fig['seconds']:.0f} s in all, drained in {fig['drain']['seconds']} s")
    print(f"executions submitted: {ex['submitted']} ({ex['acknowledged']} acknowledged); "
          f"{ex['total']} in the database ({ex['top_level']} top-level, "
          f"{ex['children']} children)")
    print("  by final status: " + ", ".join(f"{k} {v}" for k, v in ex["by_status"].items()))
    for kind, counts in sorted(ex["submitted_by_kind"].items()):
        print(f"    {kind:<21} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if ex["flag_kinds"]:
        print("  flagged at the end: " + ", ".join(f"{k} {v}"
                                                   for k, v in ex["flag_kinds"].items()))
    st = fig["steps"]
    print(f"steps checkpointed: {st['checkpointed']} ({st['marks']} marks; "
          f"{st['done_again_before_checkpoint']} done again before a checkpoint)")
    print(f"engine runs: {fig['engine']['runs']}; callbacks: "
          + ", ".join(f"{k} {v}" for k, v in fig["engine"]["callbacks"].items()))
    print("reconciler actions: " + (", ".join(f"{k} {v}" for k, v in
                                              fig["reconciler_actions"].items()) or "none"))
    if fig["drain"]["operator"]:
        print(f"drain operator: {fig['drain']['operator']}")
    faults = fig["faults"]
    print(f"faults injected: {faults['injected']} (failed to inject: {faults['failed']})")
    for kind, counts in faults["by_kind"].items():
        print(f"  {kind:<20} {counts.get('injected', 0)}"
              + (f" (+{counts['failed']} failed)" if counts.get("failed") else ""))
    violations = fig["violations"]
    print(f"violations: {len(violations)}")
    for v in violations:
        who = f" {v['execution_id']}" if v["execution_id"] else ""
        print(f"  [{v['invariant']}]{who}: {v['detail']}")


async def _soak(options: Options, rig: Rig, plan: Plan) -> tuple[Driver, dict[str, Any]]:
    seconds = options.minutes * 60
    async with httpx.AsyncClient(base_url=rig.api_url, timeout=10.0) as client:
        driver = Driver(rig, plan, client)
        rig.t0 = time.monotonic()
        progress = asyncio.create_task(_progress(rig))
        try:
            await asyncio.gather(_run_workload(driver, options.seed, rig.t0),
                                 _run_faults(rig, rig.t0))
            await _at(rig.t0, seconds)
            drain = await _drain(driver, rig, options.settle)
        finally:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
    return driver, drain


def run(options: Options) -> dict[str, Any]:
    """The whole soak; returns its figures (violations included)."""
    import tempfile

    seconds = options.minutes * 60
    settings = Settings(workers=options.workers)
    timings = sch.Timings(lease_ttl=settings.lease_ttl, engine_timeout=settings.engine_timeout)
    faults = sch.fault_schedule(options.seed, seconds, options.workers, timings)
    plan = workload_plan(options.seed, seconds, options.rate)
    print(f"soak: seed {options.seed}, {options.minutes:g} min, {options.workers} workers, "
          f"{len(plan.submissions)} submissions planned, {len(plan.actions)} operator actions")
    print(sch.describe_schedule(faults), flush=True)
    folder = options.folder or Path(tempfile.mkdtemp(prefix="veracity-soak-"))
    folder.mkdir(parents=True, exist_ok=True)
    rig = Rig(folder, settings, say=lambda s: print(s, flush=True))
    rig.faults = [FaultRecord(f) for f in faults]
    started = time.monotonic()
    try:
        rig.start()
        driver, drain = asyncio.run(_soak(options, rig, plan))
        for proc in rig.processes():
            proc.end()
        assert rig.fake is not None
        report = check(rig.database_url, driver.expected, rig.fake, rig.marks_dir)
        rig.dump(folder / "database.sql")
        figures = _figures(options, rig, driver, report, drain, time.monotonic() - started)
    finally:
        rig.stop()
    json_path = options.json_path or folder / "soak.json"
    json_path.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print_figures(figures)
    print(f"figures written to {json_path}; process logs in {folder}")
    return figures
