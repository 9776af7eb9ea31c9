"""The soak's workload, planned from the seed (:func:`workload_plan`): what is submitted when,
and what an operator does to it afterwards (cancel, pause, unpause, send a message).

The external workflows are the fake n8n's webhooks, one per behaviour (:data:`EXTERNAL`):
each webhook's script says what its runs do, so a run's behaviour follows from its
workflow's name whoever submits it (a parent's delegated child included).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from bench.soak import app as soak_app
from veracity.testing.fake_n8n import Script, Wait, Work


@dataclass(frozen=True)
class External:
    """A workflow delegated to n8n: its webhook, its script there and its limit."""

    ffqn: str
    webhook: str
    script: Script
    max_duration: str


def _external(name: str, script: Script, max_duration: str = "1h",
              cancellable: bool = False) -> External:
    suffix = ".run-cancellable" if cancellable else ".run"
    return External(f"soak:n8n/{name}{suffix}", f"soak-{name}", script, max_duration)


EXTERNAL: dict[str, External] = {e.ffqn: e for e in (
    _external("ok", Script.succeed(1.0, result={"shipped": True})),
    _external("slow", Script.succeed(4.0, result={"shipped": True})),
    _external("fail", Script.fail(0.5, error="card declined")),
    _external("lost", Script.succeed(0.5, result={"shipped": True}, callback="lose")),
    _external("dup", Script.succeed(0.5, result={"shipped": True}, callback="duplicate")),
    _external("parked", Script(steps=(Wait(3.0, park=True, stale_stopped_for=1.0),
                                      Work(0.5)), result={"shipped": True})),
    _external("overrun", Script.succeed(60.0, result={"late": True}), max_duration="8s"),
    _external("crash", Script(steps=(Work(0.5),), outcome="crash")),
    _external("slow", Script.succeed(6.0, result={"shipped": True}), cancellable=True),
)}
EXTERNAL_PLAIN = [f for f in EXTERNAL if not f.endswith("-cancellable")]
EXTERNAL_CANCELLABLE = [f for f in EXTERNAL if f.endswith("-cancellable")]
DELEGATED_CHILDREN = ["soak:n8n/ok.run", "soak:n8n/slow.run", "soak:n8n/fail.run",
                      "soak:n8n/lost.run"]


@dataclass
class Submission:
    """One top-level execution the workload submits."""

    at: float
    key: str
    kind: str
    ffqn: str
    params: list[Any]
    paused: bool = False


@dataclass(frozen=True)
class Action:
    """What an operator does to a submission: ``cancel``, ``pause``, ``unpause`` or
    ``message`` (with its topic and payload)."""

    at: float
    key: str
    verb: str
    topic: str | None = None
    payload: Any = None


@dataclass
class Plan:
    submissions: list[Submission] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)


_KINDS: dict[str, float] = {
    "steps": 16, "ticker": 8, "sleeper": 9, "fanout": 8, "fanout_cancellable": 4,
    "inbox": 9, "delegator": 6, "external": 30, "external_cancellable": 6,
}


def workload_plan(seed: int, seconds: float, rate: float) -> Plan:
    """About ``rate`` submissions a second for ``seconds``, with their operator actions
    (an action planned after ``seconds`` is left to the drain: see bench/soak/run.py)."""
    rng = random.Random(f"soak-workload:{seed}")
    plan = Plan()
    kinds = list(_KINDS)
    weights = [_KINDS[k] for k in kinds]
    at = 1.0
    n = 0
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        n += 1
        key = f"k{n:05d}"
        kind = rng.choices(kinds, weights)[0]
        sub = _submission(rng, round(at, 2), key, kind)
        plan.submissions.append(sub)
        plan.actions.extend(_actions(rng, sub))
        if sub.paused:
            plan.actions.append(Action(round(at + rng.uniform(1.0, 8.0), 2), key, "unpause"))
        elif rng.random() < 0.07:
            pause_at = at + rng.uniform(0.0, 4.0)
            plan.actions.append(Action(round(pause_at, 2), key, "pause"))
            plan.actions.append(Action(round(pause_at + rng.uniform(1.0, 6.0), 2), key,
                                       "unpause"))
    plan.actions.sort(key=lambda a: (a.at, a.key, a.verb))
    return plan


def _submission(rng: random.Random, at: float, key: str, kind: str) -> Submission:
    paused = rng.random() < 0.03
    if kind == "steps":
        return Submission(at, key, kind, soak_app.STEPS,
                          [rng.randint(2, 6), round(rng.uniform(0.05, 0.4), 2)], paused)
    if kind == "ticker":
        return Submission(at, key, kind, soak_app.TICKER, [rng.randint(10, 40), 0.1], paused)
    if kind == "sleeper":
        return Submission(at, key, kind, soak_app.SLEEPER, [round(rng.uniform(0.5, 6.0), 1)],
                          paused)
    if kind == "fanout":
        return Submission(at, key, kind, soak_app.FANOUT,
                          [rng.randint(2, 4), rng.randint(1, 3)], paused)
    if kind == "fanout_cancellable":
        return Submission(at, key, kind, soak_app.FANOUT_CANCELLABLE,
                          [rng.randint(2, 3), rng.randint(10, 30)], paused)
    if kind == "inbox":
        return Submission(at, key, kind, soak_app.INBOX, [f"topic-{key}", 20.0], paused)
    if kind == "delegator":
        return Submission(at, key, kind, soak_app.DELEGATOR,
                          [rng.choice(DELEGATED_CHILDREN), f"order-{key}"], paused)
    if kind == "external":
        return Submission(at, key, kind, rng.choice(EXTERNAL_PLAIN), [f"order-{key}"], paused)
    if kind == "external_cancellable":
        return Submission(at, key, kind, rng.choice(EXTERNAL_CANCELLABLE), [f"order-{key}"],
                          paused)
    raise ValueError(f"unknown workload kind {kind!r}")


def _actions(rng: random.Random, sub: Submission) -> list[Action]:
    if sub.kind in ("ticker", "fanout_cancellable", "external_cancellable"):
        if rng.random() < 0.6:
            return [Action(round(sub.at + rng.uniform(0.3, 6.0), 2), sub.key, "cancel")]
    if sub.kind == "inbox":
        # most get their message, some before they ask for it; the rest time out
        if rng.random() < 0.85:
            return [Action(round(sub.at + rng.uniform(0.0, 12.0), 2), sub.key, "message",
                           topic=str(sub.params[0]), payload={"for": sub.key})]
    return []
