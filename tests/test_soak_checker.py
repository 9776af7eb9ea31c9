"""The soak's invariant checker (bench/soak/checker.py) finds each violation it is meant to
find, in a database written by hand to break one guarantee of docs/states.md per execution,
and finds nothing in executions that keep them."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from bench.soak.checker import Expected, Report, Violation, check

from veracity.testing.fake_n8n import FakeN8n, Script

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Db:
    """Writes executions and their history straight into a migrated database."""

    def __init__(self, url: str) -> None:
        self.url = url

    def add(self, status: str, events: list[tuple[str, dict[str, Any]]], *,
            seqs: list[int] | None = None, key: str | None = None, engine: str | None = None,
            at: datetime = T0, ident: str | None = None) -> str:
        ident = ident or str(uuid.uuid4())
        seqs = seqs or list(range(1, len(events) + 1))
        result = json.dumps({"ok": True}) if status == "completed" else None
        with psycopg.connect(self.url) as conn:
            conn.execute(
                "INSERT INTO veracity_executions (id, ffqn, params, status, result, "
                "deployment_id, idempotency_key, scheduled_at, created_at, updated_at, "
                "history_seq, engine) VALUES (%s, 'soak:work/steps.run', '[]', %s, %s, 'd', "
                "%s, %s, %s, %s, %s, %s)",
                (ident, status, result, key, T0, T0, T0, max(seqs), engine))
            for seq, (kind, data) in zip(seqs, events, strict=True):
                conn.execute("INSERT INTO veracity_history (execution_id, seq, kind, at, data) "
                             "VALUES (%s, %s, %s, %s, %s)",
                             (ident, seq, kind, at + timedelta(seconds=seq), json.dumps(data)))
        return ident

    def message(self, ident: str) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("INSERT INTO veracity_messages (execution_id, topic, payload, "
                               "created_at) VALUES (%s, 't', '1', %s) RETURNING id",
                               (ident, T0)).fetchone()
        assert row is not None
        return int(row[0])


def claim(epoch: int) -> tuple[str, dict[str, Any]]:
    return ("running", {"owner": "w", "epoch": epoch, "attempt": epoch})


def step(pos: int, label: str, token: str) -> tuple[str, dict[str, Any]]:
    return ("step_completed", {"pos": pos, "name": "bench.soak.app._work", "args": "x",
                               "attempts": 1, "result": {"step": label, "token": token}})


PENDING: tuple[str, dict[str, Any]] = ("pending", {})
COMPLETED: tuple[str, dict[str, Any]] = ("completed", {})


def write_marks(folder: Path, marks: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "marks-1.jsonl").write_text("".join(json.dumps(m) + "\n" for m in marks))


def mark(ident: str, label: str, epoch: int, token: str) -> dict[str, Any]:
    return {"e": ident, "step": label, "epoch": epoch, "token": token, "pid": 1}


def found(report: Report, ident: str | None) -> list[tuple[str, str]]:
    return [(v.invariant, v.detail) for v in report.violations if v.execution_id == ident]


def kinds(violations: list[Violation], ident: str | None) -> set[str]:
    return {v.invariant for v in violations if v.execution_id == ident}


@pytest.fixture
def fake() -> FakeN8n:
    fake = FakeN8n()
    fake.add_webhook("soak-ok", Script.forever())
    return fake


def test_executions_that_keep_every_guarantee_are_not_reported(pg_url: str, tmp_path: Path,
                                                               fake: FakeN8n) -> None:
    db = Db(pg_url)
    good = db.add("completed", [PENDING, claim(1), step(0, "s0", "a"), ("pending", {}),
                                claim(2), step(1, "s1", "b"), COMPLETED], key="k-good")
    # a step done twice before its checkpoint (the first run died): at-least-once, allowed
    write_marks(tmp_path, [mark(good, "s0", 1, "a"), mark(good, "s1", 1, "zombie"),
                           mark(good, "s1", 2, "b")])
    paused = db.add("cancelled", [("paused", {}), ("pending", {}), ("cancelled", {})])
    msg = db.message(paused)

    report = check(pg_url, Expected({"k-good": good}, {msg: paused}), fake, tmp_path)

    assert report.violations == []
    assert report.steps_checkpointed == 2 and report.steps_redone == 1
    assert report.by_status == {"cancelled": 1, "completed": 1}


def test_each_broken_guarantee_is_reported(pg_url: str, tmp_path: Path, fake: FakeN8n) -> None:
    db = Db(pg_url)
    never_stored = str(uuid.uuid4())
    stuck = db.add("running", [PENDING, claim(1)])
    twice_terminal = db.add("completed", [PENDING, claim(1), COMPLETED, COMPLETED])
    gap = db.add("completed", [PENDING, claim(1), COMPLETED], seqs=[1, 2, 4])
    other_status = db.add("completed", [PENDING, claim(1), ("failed", {})])
    no_claim = db.add("completed", [PENDING, COMPLETED])
    step_twice = db.add("completed", [PENDING, claim(1), step(0, "s0", "a"),
                                      step(0, "s0", "b"), COMPLETED])
    redone = db.add("completed", [PENDING, claim(1), step(0, "s0", "a"), ("pending", {}),
                                  claim(2), COMPLETED])
    unmarked = db.add("completed", [PENDING, claim(1), step(0, "s0", "c"), COMPLETED])
    received_twice = db.add("completed", [PENDING, claim(1),
                                          ("message_received", {"pos": 0, "message_id": 9}),
                                          ("message_received", {"pos": 1, "message_id": 9}),
                                          COMPLETED])
    write_marks(tmp_path, [mark(step_twice, "s0", 1, "a"), mark(step_twice, "s0", 1, "b"),
                           mark(redone, "s0", 1, "a"), mark(redone, "s0", 2, "again"),
                           mark(unmarked, "s0", 2, "c")])
    # a delegated execution recorded terminal (by a worker, not the callback) while its
    # engine run goes on; and triggered twice
    ident = str(uuid.uuid4())
    for _ in range(2):
        run_id, _script = fake.trigger("soak-ok", {"execution_id": ident})
        assert run_id is not None
    db.add("completed", [PENDING, claim(1), ("completed", {"by": "worker"})], engine="n8n",
           at=datetime.now(UTC), ident=ident)

    report = check(pg_url, Expected({"k-lost": never_stored, "k-stuck": stuck},
                                    {12345: stuck}), fake, tmp_path)
    v = report.violations

    assert kinds(v, never_stored) == {"lost"}
    assert ("lost", "message 12345 acknowledged, not stored") in found(report, stuck)
    assert "not_drained" in kinds(v, stuck)
    assert kinds(v, twice_terminal) == {"terminal", "history"}  # completed -> completed
    assert ("terminal", "2 terminal events: [(3, 'completed'), (4, 'completed')]") in found(
        report, twice_terminal)
    assert kinds(v, gap) == {"history"}
    assert "seqs [1, 2, 4]" in found(report, gap)[0][1]
    assert {"terminal", "history"} <= kinds(v, other_status)
    assert kinds(v, no_claim) == {"history"}
    assert "pending (seq 1) -> completed (seq 2) is not a transition" in found(report,
                                                                               no_claim)[0][1]
    assert "step_twice" in kinds(v, step_twice)
    assert [d for k, d in found(report, redone) if k == "marks"] == [
        "step s0 done again by the run claimed at seq 5 (epoch 2) after its checkpoint at "
        "seq 3"]
    assert any("no mark of its work under that claim" in d for _, d in found(report, unmarked))
    assert kinds(v, received_twice) == {"message"}
    truthful = [d for k, d in found(report, ident) if k == "truthful"]
    assert any("is still going" in d for d in truthful), truthful
    assert any("triggered 2 times" in d for d in truthful), truthful
    assert any("completed without its run's callback" in d for d in truthful), truthful
