"""The soak's invariant checker: reads the database, the workers' marks files and the fake
n8n's ground truth once the soak has drained, and lists every violation of the guarantees
of docs/states.md that it can see.

- ``lost``: a submission the API acknowledged (or whose idempotency key it knows) has no
  execution; a child recorded in a parent's history does not exist; a message the API
  acknowledged is not stored.
- ``not_drained``: an execution still not terminal after the drain.
- ``terminal``: a terminal execution without exactly one terminal event, or whose status is
  not that event's kind; a non-terminal one with a terminal event.
- ``history``: sequence numbers not exactly 1..n (n = the row's ``history_seq``); a state
  event not allowed after the one before it by the transition table; the last state event
  not the execution's status.
- ``step_twice``: a step position checkpointed twice in one history.
- ``marks``: a checkpointed step whose work no mark records under the claim that wrote the
  checkpoint; a mark left by a run claimed after the step's checkpoint (the replay did the
  step again); a mark under a claim the history does not have.
- ``message``: a message delivered twice (two ``message_received`` events for one id).
- ``truthful``: an execution terminal in Veracity while its engine run was still going
  (the fake's own check, with the terminal times from history); an execution triggered
  twice; a delegated execution completed otherwise than by its run's callback.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from veracity.core.states import TERMINAL, TRANSITIONS, Status
from veracity.testing.fake_n8n import FakeN8n

STATES = frozenset(str(s) for s in Status)
TERMINAL_KINDS = frozenset(str(s) for s in TERMINAL)


@dataclass
class Violation:
    invariant: str
    execution_id: str | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "execution_id": self.execution_id,
                "detail": self.detail}

    def __str__(self) -> str:
        who = f" {self.execution_id}" if self.execution_id else ""
        return f"[{self.invariant}]{who}: {self.detail}"


@dataclass
class Expected:
    """What the soak's driver knows was acknowledged: submissions by idempotency key (the
    id the API answered, or None if no answer ever came) and messages by id."""

    submissions: dict[str, str | None] = field(default_factory=dict)
    messages: dict[int, str] = field(default_factory=dict)


@dataclass
class Report:
    violations: list[Violation]
    executions: int
    by_status: dict[str, int]
    by_ffqn: dict[str, dict[str, int]]
    top_level: int
    children: int
    flagged: dict[str, int]
    steps_checkpointed: int
    steps_redone: int
    marks: int
    engine_runs: int
    callbacks: dict[str, int]
    histories: dict[str, list[dict[str, Any]]]


def _load(url: str) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]],
                             list[dict[str, Any]]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT id::text AS id, ffqn, status, parent_id::text AS parent_id, "
            "idempotency_key, engine, external_execution_id, flag_kind, history_seq, "
            "attempt FROM veracity_executions").fetchall()
        history: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for ev in conn.execute("SELECT execution_id::text AS execution_id, seq, kind, at, "
                               "data FROM veracity_history ORDER BY execution_id, seq"):
            history[ev["execution_id"]].append(ev)
        messages = conn.execute(
            "SELECT id, execution_id::text AS execution_id, topic, consumed_at, consumed_pos "
            "FROM veracity_messages").fetchall()
    return rows, history, messages


def read_marks(folder: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(folder.glob("marks-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def check(url: str, expected: Expected, fake: FakeN8n, marks_dir: Path) -> Report:
    rows, history, messages = _load(url)
    marks = read_marks(marks_dir)
    found: list[Violation] = []
    by_id = {r["id"]: r for r in rows}
    by_key = {r["idempotency_key"]: r for r in rows if r["idempotency_key"]}

    # -- nothing lost ---------------------------------------------------------------------
    for key, ident in expected.submissions.items():
        row = by_key.get(key)
        if ident is not None and ident not in by_id:
            found.append(Violation("lost", ident, f"submitted as {key}, acknowledged, absent"))
        elif ident is not None and (row is None or row["id"] != ident):
            found.append(Violation("lost", ident, f"idempotency key {key} names "
                                   f"{row['id'] if row else 'nothing'}"))
    for ident, events in history.items():
        for ev in events:
            if ev["kind"] in ("child_submitted", "scheduled"):
                child = ev["data"].get("child_id") or ev["data"].get("execution_id")
                if child is not None and child not in by_id:
                    found.append(Violation("lost", ident, f"{ev['kind']} {child} at seq "
                                           f"{ev['seq']} does not exist"))
    stored = {m["id"]: m for m in messages}
    for message_id, ident in expected.messages.items():
        m = stored.get(message_id)
        if m is None or m["execution_id"] != ident:
            found.append(Violation("lost", ident, f"message {message_id} acknowledged, "
                                   "not stored"))

    # -- per execution: drained, terminal, history ----------------------------------------
    for row in rows:
        ident, status = row["id"], row["status"]
        events = history.get(ident, [])
        if status not in TERMINAL_KINDS:
            found.append(Violation("not_drained", ident, f"{row['ffqn']} is {status} "
                                   f"(flag {row['flag_kind']}) after the drain"))
        seqs = [ev["seq"] for ev in events]
        if seqs != list(range(1, len(seqs) + 1)) or len(seqs) != row["history_seq"]:
            found.append(Violation("history", ident, f"seqs {_runs(seqs)}, history_seq "
                                   f"{row['history_seq']}"))
        terminal = [ev for ev in events if ev["kind"] in TERMINAL_KINDS]
        if status in TERMINAL_KINDS:
            if len(terminal) != 1:
                found.append(Violation("terminal", ident, f"{len(terminal)} terminal events: "
                                       f"{[(ev['seq'], ev['kind']) for ev in terminal]}"))
            elif terminal[0]["kind"] != status:
                found.append(Violation("terminal", ident, f"status {status}, terminal event "
                                       f"{terminal[0]['kind']}"))
        elif terminal:
            found.append(Violation("terminal", ident, f"status {status} with terminal event "
                                   f"{terminal[0]['kind']} at seq {terminal[0]['seq']}"))
        states = [ev for ev in events if ev["kind"] in STATES]
        if not states:
            found.append(Violation("history", ident, "no state event"))
            continue
        if states[-1]["kind"] != status:
            found.append(Violation("history", ident, f"status {status}, last state event "
                                   f"{states[-1]['kind']} (seq {states[-1]['seq']})"))
        if states[0]["kind"] not in (Status.PENDING, Status.PAUSED):
            found.append(Violation("history", ident, f"first state {states[0]['kind']}"))
        for before, after in itertools.pairwise(states):
            if Status(after["kind"]) not in TRANSITIONS[Status(before["kind"])]:
                found.append(Violation("history", ident, f"{before['kind']} (seq "
                                       f"{before['seq']}) -> {after['kind']} (seq "
                                       f"{after['seq']}) is not a transition"))

    # -- steps and their marks ------------------------------------------------------------
    marks_of: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for mark in marks:
        marks_of[(mark["e"], mark["step"])].append(mark)
    checkpointed = 0
    redone = 0
    for ident, events in history.items():
        claims = {ev["data"].get("epoch"): ev["seq"] for ev in events
                  if ev["kind"] == Status.RUNNING and isinstance(ev["data"], dict)}
        positions = Counter(ev["data"].get("pos") for ev in events
                            if ev["kind"] == "step_completed")
        for pos, n in positions.items():
            if n > 1:
                found.append(Violation("step_twice", ident, f"position {pos} checkpointed "
                                       f"{n} times"))
        for ev in events:
            if ev["kind"] != "step_completed":
                continue
            result = ev["data"].get("result")
            if not isinstance(result, dict) or "token" not in result:
                continue  # not one of the soak's marked steps
            checkpointed += 1
            label = str(result["step"])
            under = [c for c in events if c["kind"] == Status.RUNNING and c["seq"] < ev["seq"]]
            epoch = under[-1]["data"].get("epoch") if under else None
            step_marks = marks_of.get((ident, label), [])
            redone += max(0, len(step_marks) - 1)
            if not any(m["token"] == result["token"] and m["epoch"] == epoch
                       for m in step_marks):
                found.append(Violation("marks", ident, f"step {label} checkpointed at seq "
                                       f"{ev['seq']} under epoch {epoch}: no mark of its work "
                                       f"under that claim ({step_marks})"))
            for m in step_marks:
                seq = claims.get(m["epoch"])
                if seq is None:
                    found.append(Violation("marks", ident, f"step {label} marked under epoch "
                                           f"{m['epoch']}, which no claim in history has"))
                elif seq > ev["seq"]:
                    found.append(Violation("marks", ident, f"step {label} done again by the "
                                           f"run claimed at seq {seq} (epoch {m['epoch']}) "
                                           f"after its checkpoint at seq {ev['seq']}"))

    # -- messages -------------------------------------------------------------------------
    for ident, events in history.items():
        got = Counter(ev["data"].get("message_id") for ev in events
                      if ev["kind"] == "message_received")
        for message_id, n in got.items():
            if n > 1:
                found.append(Violation("message", ident, f"message {message_id} received "
                                       f"{n} times"))

    # -- truthful ends of delegated runs --------------------------------------------------
    delegated = [r for r in rows if r["engine"] is not None]
    terminal_at: dict[str, datetime] = {}
    for row in delegated:
        for ev in history.get(row["id"], []):
            if ev["kind"] in TERMINAL_KINDS:
                terminal_at[row["id"]] = ev["at"]
                break
    for line in fake.truthful_violations(terminal_at):
        ident = line.split()[1].rstrip(":") if line.startswith("execution_id ") else None
        found.append(Violation("truthful", ident, line))
    truths = fake.truths()
    runs_of = Counter(t.execution_id for t in truths if t.execution_id)
    for ident, n in runs_of.items():
        if n > 1:
            found.append(Violation("truthful", ident, f"triggered {n} times in the engine"))
    callbacks = fake.callbacks()
    completed_by_callback = {c.execution_id for c in callbacks
                             if c.kind == "complete" and c.status_code == 200}
    for row in delegated:
        if row["status"] != Status.COMPLETED:
            continue
        ev = next(ev for ev in history[row["id"]] if ev["kind"] == Status.COMPLETED)
        if ev["data"].get("by") != "callback" or row["id"] not in completed_by_callback:
            found.append(Violation("truthful", row["id"], f"completed without its run's "
                                   f"callback: {ev['data']}"))

    # -- figures --------------------------------------------------------------------------
    by_ffqn: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        by_ffqn[row["ffqn"]][row["status"]] += 1
    involved = {v.execution_id for v in found if v.execution_id}
    histories = {ident: [_event_json(ev) for ev in history.get(ident, [])]
                 for ident in sorted(involved)[:50]}
    callback_counts = Counter(
        f"{c.kind} {c.status_code if c.status_code is not None else 'error'}" for c in callbacks)
    return Report(
        violations=found,
        executions=len(rows),
        by_status=dict(sorted(Counter(r["status"] for r in rows).items())),
        by_ffqn={f: dict(sorted(c.items())) for f, c in sorted(by_ffqn.items())},
        top_level=sum(1 for r in rows if r["parent_id"] is None),
        children=sum(1 for r in rows if r["parent_id"] is not None),
        flagged=dict(Counter(r["flag_kind"] for r in rows if r["flag_kind"])),
        steps_checkpointed=checkpointed,
        steps_redone=redone,
        marks=len(marks),
        engine_runs=len(truths),
        callbacks=dict(sorted(callback_counts.items())),
        histories=histories,
    )


def _event_json(ev: dict[str, Any]) -> dict[str, Any]:
    return {"seq": ev["seq"], "kind": ev["kind"], "at": ev["at"].isoformat(),
            "data": ev["data"]}


def _runs(seqs: list[int]) -> str:
    if len(seqs) > 12:
        return f"{seqs[:6]} ... {seqs[-6:]} ({len(seqs)} events)"
    return str(seqs)
