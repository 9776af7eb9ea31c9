"""A faithful fake n8n, for tests and benchmarks.

It serves, over real HTTP, the parts of n8n that Veracity's adapter uses, and reproduces the
behaviour a real n8n shows (1.123 observed on a real instance; n8n's source and documentation
checked for the rest):

* ``POST /webhook/{path}`` (and ``/webhook-test/{path}``) starts a run of the workflow registered
  at that path. By default the fake answers like a Webhook node in ``responseNode`` mode followed
  by a Respond to Webhook node returning ``{{ { executionId: $execution.id } }}``: at once,
  ``{"executionId": "<id>"}``, the id a JSON string of digits, increasing. ``respond="default"``
  answers n8n's default ``{"message": "Workflow was started"}`` (no id). An unknown path answers
  404 ``{"code": 404, "message": "The requested webhook \\"POST x\\" is not registered.",
  "hint": ...}``.
* ``GET /api/v1/executions/{id}`` (header ``X-N8N-API-KEY``): missing key 401 ``{"message":
  "'X-N8N-API-KEY' header required"}``, wrong key 401 ``{"message": "unauthorized"}``, non-numeric
  id 400 ``{"message": "request/params/id must be number"}``, unknown id 404 ``{"message":
  "Not Found"}``; otherwise the execution: ``id`` (string), ``finished`` (true only for
  success), ``mode`` ("webhook"), ``retryOf``, ``retrySuccessId``, ``status``, ``createdAt``,
  ``startedAt``, ``stoppedAt``, ``deletedAt``, ``workflowId``, ``waitTill``, ``storedAt``.
* ``GET /api/v1/executions`` lists executions newest first (``{"data": [...], "nextCursor"}``) but
  omits every run n8n holds in memory: new, running and waiting ones. Listing cannot reconcile.
* Stopping. n8n 1.x (``version="1.123"``, the default) has no public stop: ``POST
  /api/v1/executions/{id}/stop`` answers 404 ``{"message": "not found"}``. The internal ``POST
  /rest/executions/{id}/stop`` needs the ``n8n-auth`` cookie from ``POST /rest/login``
  ``{"emailOrLdapLoginId", "password"}`` and the same ``browser-id`` header that was sent at login
  (else 401 ``{"status": "error", "message": "Unauthorized"}``). It answers 200 ``{"data":
  {mode, startedAt, stoppedAt, finished, status}}``; a run that is no longer new, running or
  waiting answers 500 ``{"code": 0, "message": "Only running or waiting executions can be stopped
  and <id> is currently <status>"}``, an unknown id 500 ``{"code": 0, "message": "Failed to find
  execution to stop"}``. With ``version="2.0"`` the public stop exists too (API key): 200 with
  the same fields unwrapped, 500 ``{"message": "Only running or waiting ..."}`` for a stopped run,
  404 ``{"message": "Not Found"}`` for an unknown id (as n8n's handler does).
* Wait nodes. A parked run reads ``waiting`` with ``stoppedAt`` SET and ``waitTill`` the resume
  time (``3000-01-01T00:00:00.000Z`` when it waits for a webhook). Like n8n, a timed wait shorter
  than 65 s does not park (it stays ``running``, ``stoppedAt`` null) unless ``park=True``. At the
  resume ``startedAt`` is overwritten (``createdAt`` keeps the original start), ``waitTill`` is
  cleared, and for ``stale_stopped_for`` seconds the run reads ``running`` with the OLD
  ``stoppedAt`` still set. ``POST /webhook-waiting/{id}`` resumes a run waiting for a webhook.
* Restart. :meth:`FakeN8n.kill` takes the engine down: every running run really stops there
  (ground truth) though its record still says ``running``; while down every engine request
  answers 503 ``{"code": 503, "message": "n8n is down (fake n8n: simulated restart)"}`` (the
  fake's choice: it cannot refuse connections while the control API stays up). :meth:`FakeN8n.start`
  brings it back: those runs read ``crashed``, waiting runs survive, and ``stoppedAt`` of waiting
  and crashed runs is rewritten to the start time. :meth:`FakeN8n.restart` is kill then start.
* Starting up (n8n's ``BaseCommand.init``: it listens, then migrates its database, then mounts
  its routes). ``/healthz`` answers ``{"status": "ok"}`` throughout. ``start(migrating_for=m,
  starting_for=s)``: for ``m`` seconds every other route answers 200 text/html ``n8n is
  starting up. Please wait`` (n8n's gate while its migrations run; a restart without pending
  migrations passes it in an instant); then for ``s`` seconds every other route answers what
  Express answers for a route not mounted yet: 404 text/html, its default page ``Cannot
  <METHOD> <path>`` (seen on a real n8n 1.123 for about 4 s after a crash or a clean restart,
  on ``GET /api/v1/executions/{id}``; a genuinely unknown id answers the API's JSON 404).
  ``FakeN8n(migrating_for=, starting_for=)`` opens the same windows when the fake starts
  being served, as a freshly started n8n.

Each run follows a :class:`Script` (chosen per run by Veracity execution id, else the next one
queued for the path, else the path's default): steps of :class:`Work` and :class:`Wait`, then an
outcome (success, error, crash, forget, keep_running), plus misbehaviours: refuse the trigger,
answer it late or never, lose or duplicate the callback, ignore or fail stops, answer the
execution GET with a 5xx, late, never, with a body that is not JSON, or with another status.

On success the fake POSTs ``{"result": ...}`` to the trigger's ``callback.complete_url``, on error
``{"error": ...}`` (plus ``"transient"`` if the script sets it) to ``callback.fail_url``, with
``Authorization: Bearer <callback.token>``, and records every attempt with its HTTP status. It
calls back after the run has stopped. (In a real n8n the HTTP Request node that calls back is
part of the run, so the callback reaches Veracity a few milliseconds before n8n sets
``stoppedAt``.)

Ground truth: for each run, when it really started and stopped (wall clock from the fake's
clock, and ``time.monotonic()`` when the fake made the change observable), every transition and
every stop request. A run is "going" from its trigger until it really stops; waiting counts as
going. :meth:`FakeN8n.truthful_violations` checks the invariant "no execution is ever terminal in
Veracity while its run is still going in the engine".

Times come from an injectable clock (``clock=`` a callable returning an aware datetime; default
the time of day in UTC). Runs advance lazily (on every request) and from a ticker every ``tick``
seconds while the app is served, which is also what sends callbacks.

Control HTTP API (never delayed, available while the engine is down), JSON in and out:
``GET /_fake/health``; ``POST /_fake/webhooks`` ``{path, script?, workflow_id?}``; ``POST
/_fake/webhooks/next`` ``{path, script}``; ``POST /_fake/scripts/by-execution`` ``{execution_id,
script}``; ``GET /_fake/runs``; ``GET /_fake/runs/{id}``; ``PATCH /_fake/runs/{id}`` ``{callback?,
ignore_stops?, stop_failures?, get_error?, get_delay?, get_hang?, get_raw_body?,
report_status?}``; ``POST /_fake/runs/{id}/resume``; ``POST /_fake/runs/{id}/finish`` ``{outcome,
result?, error?}``; ``POST /_fake/runs/{id}/forget``; ``POST /_fake/kill``; ``POST /_fake/start``
``{starting_for?, migrating_for?}``; ``POST /_fake/restart`` ``{starting_for?, migrating_for?}``;
``GET /_fake/callbacks``;
``PATCH /_fake/settings`` ``{latency?, version?}``; ``POST /_fake/violations`` ``{terminal_at:
{execution_id: iso}}``. Scripts in JSON: see :meth:`Script.from_json`.

Run it alone: ``python -m veracity.testing.fake_n8n --port 5678 [--version 1.123|2.0]
[--api-key KEY] [--email E --password P] [--latency S] [--webhook PATH ...]
[--migrating-for S] [--starting-for S]`` (the last two: the start-up windows, from launch).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import heapq
import json
import math
import re
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Any, Literal, cast

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

__all__ = [
    "PARK_THRESHOLD_SECONDS",
    "WAIT_INDEFINITELY",
    "CallbackAttempt",
    "FakeN8n",
    "RunTruth",
    "Script",
    "StopRecord",
    "Transition",
    "Wait",
    "Work",
    "create_app",
    "main",
    "running",
    "serve_asgi_in_thread",
    "serve_in_thread",
]

WAIT_INDEFINITELY = datetime(3000, 1, 1, tzinfo=UTC)
"""n8n's ``waitTill`` for a run that waits for a webhook."""

PARK_THRESHOLD_SECONDS = 65.0
"""n8n's Wait node keeps shorter waits in memory (status running) and parks longer ones."""

STATUSES = ("new", "running", "waiting", "success", "error", "canceled", "crashed", "unknown")
STOPPABLE = frozenset({"new", "unknown", "waiting", "running"})
IN_MEMORY = frozenset({"new", "running", "waiting"})
LIST_STATUS_FILTER = ("canceled", "error", "running", "success", "waiting")
AUTH_COOKIE = "n8n-auth"

Outcome = Literal["success", "error", "crash", "forget", "keep_running"]
Respond = Literal["id", "default", "refuse", "hang"]
CallbackMode = Literal["once", "lose", "duplicate"]
_OUTCOMES: tuple[str, ...] = ("success", "error", "crash", "forget", "keep_running")
_RESPONDS: tuple[str, ...] = ("id", "default", "refuse", "hang")
_CALLBACK_MODES: tuple[str, ...] = ("once", "lose", "duplicate")


def _utc_now() -> datetime:
    return datetime.now(UTC)


def iso(value: datetime | None) -> str | None:
    """n8n's JSON date form: ``2026-04-11T03:34:58.155Z``."""
    if value is None:
        return None
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return value


# --------------------------------------------------------------------------------------------
# Scripts


@dataclass(frozen=True)
class Work:
    """The run is busy (status running, stoppedAt null) for ``seconds`` (None: forever)."""

    seconds: float | None = 0.2


@dataclass(frozen=True)
class Wait:
    """A Wait node.

    ``seconds=None`` waits for a webhook (``waitTill`` year 3000) until :meth:`FakeN8n.resume`
    or ``POST /webhook-waiting/{id}``. ``park``: None behaves like n8n (park when the wait is
    65 s or longer); True/False force it. A parked run reads waiting with stoppedAt set; after the
    resume it reads running with the old stoppedAt for ``stale_stopped_for`` seconds.
    """

    seconds: float | None = None
    park: bool | None = None
    stale_stopped_for: float = 2.0

    def parks(self) -> bool:
        if self.seconds is None:
            return True
        if self.park is not None:
            return self.park
        return self.seconds >= PARK_THRESHOLD_SECONDS


Step = Work | Wait


@dataclass(frozen=True)
class Script:
    """What one run does, and how the fake misbehaves around it.

    Run: ``queued_for`` seconds in status new, then ``steps``, then ``outcome``: ``success``
    (calls the complete URL with ``result``), ``error`` (calls the fail URL with ``error`` and,
    when not None, ``transient``), ``crash`` (status crashed, no callback), ``forget`` (the run
    vanishes: 404 from then on, no callback) or ``keep_running`` (never ends by itself).

    Trigger: ``respond`` = ``id`` (``{"executionId": "<id>"}``), ``default`` (n8n's default
    ``{"message": "Workflow was started"}``), ``refuse`` (``refuse_status`` with ``refuse_body``,
    no run is created; the default is what a Webhook node's header auth answers) or ``hang``
    (the run starts, the answer never comes until the fake shuts down). ``respond_delay`` delays
    the answer after the run has started (longer than the caller's timeout: the run exists, the
    caller never learns its id).

    Callbacks: ``callback`` = ``once``, ``lose`` (never called) or ``duplicate`` (called twice).
    Stops: the first ``stop_failures`` stop requests answer 500 and change nothing; the next
    ``ignore_stops`` answer OK (claiming canceled) while the run keeps running.
    Execution GET: ``get_error`` answers that HTTP status instead; ``get_delay`` answers late;
    ``get_hang`` never answers (until shutdown); ``get_raw_body`` answers 200 with that text;
    ``report_status`` reports that ``status`` instead of the true one.
    """

    steps: tuple[Step, ...] = (Work(0.2),)
    outcome: Outcome = "success"
    result: Any = None
    error: Any = "scripted failure"
    transient: bool | None = None
    queued_for: float = 0.0
    respond: Respond = "id"
    respond_delay: float = 0.0
    refuse_status: int = 403
    refuse_body: Any = "Authorization data is wrong!"
    callback: CallbackMode = "once"
    ignore_stops: int = 0
    stop_failures: int = 0
    get_error: int | None = None
    get_delay: float = 0.0
    get_hang: bool = False
    get_raw_body: str | None = None
    report_status: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.steps, tuple):
            object.__setattr__(self, "steps", tuple(self.steps))
        for step in self.steps:
            if not isinstance(step, Work | Wait):
                raise ValueError(f"not a step: {step!r}")
            seconds = step.seconds
            if seconds is not None and (seconds < 0 or math.isnan(seconds)):
                raise ValueError(f"negative duration in {step!r}")
        if self.outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be one of {_OUTCOMES}, not {self.outcome!r}")
        if self.respond not in _RESPONDS:
            raise ValueError(f"respond must be one of {_RESPONDS}, not {self.respond!r}")
        if self.callback not in _CALLBACK_MODES:
            raise ValueError(f"callback must be one of {_CALLBACK_MODES}, not {self.callback!r}")
        for name in ("queued_for", "respond_delay", "get_delay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.ignore_stops < 0 or self.stop_failures < 0:
            raise ValueError("ignore_stops and stop_failures must not be negative")

    @classmethod
    def succeed(cls, after: float = 0.2, result: Any = None, **kw: Any) -> Script:
        return cls(steps=(Work(after),), outcome="success", result=result, **kw)

    @classmethod
    def fail(cls, after: float = 0.2, error: Any = "scripted failure", **kw: Any) -> Script:
        return cls(steps=(Work(after),), outcome="error", error=error, **kw)

    @classmethod
    def forever(cls, **kw: Any) -> Script:
        return cls(steps=(), outcome="keep_running", **kw)

    def to_json(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        for step in self.steps:
            if isinstance(step, Work):
                steps.append({"work": step.seconds})
            else:
                steps.append(
                    {
                        "wait": step.seconds,
                        "park": step.park,
                        "stale_stopped_for": step.stale_stopped_for,
                    }
                )
        out: dict[str, Any] = {"steps": steps}
        for name in _SCRIPT_FIELDS:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Script:
        """Build a script from JSON.

        ``{"steps": [{"work": 0.2}, {"wait": 0.3, "park": true, "stale_stopped_for": 0.5},
        {"wait": null}], "outcome": "success", ...}`` plus any other field of :class:`Script`
        by name. ``{"work": null}`` works forever; ``{"wait": null}`` waits for a webhook.
        """
        if not isinstance(data, Mapping):
            raise ValueError("a script is a JSON object")
        unknown = set(data) - {"steps", *_SCRIPT_FIELDS}
        if unknown:
            raise ValueError(f"unknown script fields: {sorted(unknown)}")
        kwargs: dict[str, Any] = {k: data[k] for k in _SCRIPT_FIELDS if k in data}
        if "steps" in data:
            raw_steps = data["steps"]
            if not isinstance(raw_steps, list):
                raise ValueError("steps is a list")
            kwargs["steps"] = tuple(_step_from_json(s) for s in raw_steps)
        return cls(**kwargs)


_SCRIPT_FIELDS: tuple[str, ...] = (
    "outcome",
    "result",
    "error",
    "transient",
    "queued_for",
    "respond",
    "respond_delay",
    "refuse_status",
    "refuse_body",
    "callback",
    "ignore_stops",
    "stop_failures",
    "get_error",
    "get_delay",
    "get_hang",
    "get_raw_body",
    "report_status",
)


def _step_from_json(raw: Any) -> Step:
    if not isinstance(raw, Mapping):
        raise ValueError(f"a step is a JSON object, not {raw!r}")
    if "work" in raw:
        if set(raw) != {"work"}:
            raise ValueError(f"unknown keys in {raw!r}")
        return Work(_opt_float(raw["work"]))
    if "wait" in raw:
        if set(raw) - {"wait", "park", "stale_stopped_for"}:
            raise ValueError(f"unknown keys in {raw!r}")
        park = raw.get("park")
        if park is not None and not isinstance(park, bool):
            raise ValueError("park is a boolean")
        stale = raw.get("stale_stopped_for", 2.0)
        return Wait(_opt_float(raw["wait"]), park=park, stale_stopped_for=float(stale))
    raise ValueError(f"a step is {{'work': s}} or {{'wait': s}}, not {raw!r}")


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number of seconds")
    return float(value)


# --------------------------------------------------------------------------------------------
# Ground truth and records


@dataclass(frozen=True)
class Transition:
    """One observable change of a run (or a ground-truth event), with its API fields after it."""

    event: str
    at: datetime
    monotonic: float
    status: str
    stopped_at: datetime | None
    wait_till: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "at": iso_full(self.at),
            "monotonic": self.monotonic,
            "status": self.status,
            "stoppedAt": iso(self.stopped_at),
            "waitTill": iso(self.wait_till),
        }


@dataclass(frozen=True)
class StopRecord:
    """A stop request and what the fake did: stopped, ignored, failed or refused."""

    at: datetime
    monotonic: float
    via: str
    outcome: str

    def to_json(self) -> dict[str, Any]:
        return {
            "at": iso_full(self.at),
            "monotonic": self.monotonic,
            "via": self.via,
            "outcome": self.outcome,
        }


@dataclass(frozen=True)
class CallbackAttempt:
    """One HTTP call of a callback URL and its answer (status, or the transport error)."""

    run_id: str
    execution_id: str | None
    kind: Literal["complete", "fail"]
    url: str
    body: Any
    attempt: int
    at: datetime
    status_code: int | None
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "execution_id": self.execution_id,
            "kind": self.kind,
            "url": self.url,
            "body": self.body,
            "attempt": self.attempt,
            "at": iso_full(self.at),
            "status_code": self.status_code,
            "error": self.error,
        }


@dataclass(frozen=True)
class RunTruth:
    """A snapshot of one run: what really happened, and what the API shows now."""

    run_id: str
    execution_id: str | None
    path: str
    workflow_id: str
    status: str
    forgotten: bool
    started_at: datetime
    started_monotonic: float
    stopped_at: datetime | None
    stopped_monotonic: float | None
    end: str | None
    transitions: tuple[Transition, ...]
    stop_requests: tuple[StopRecord, ...]
    trigger_body: Any

    @property
    def going(self) -> bool:
        return self.stopped_at is None

    def is_going_at(self, when: datetime) -> bool:
        """Whether the run had started and had not yet really stopped at ``when``."""
        _require_aware(when)
        if when < self.started_at:
            return False
        return self.stopped_at is None or when < self.stopped_at

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "execution_id": self.execution_id,
            "path": self.path,
            "workflow_id": self.workflow_id,
            "status": self.status,
            "forgotten": self.forgotten,
            "going": self.going,
            "started_at": iso_full(self.started_at),
            "started_monotonic": self.started_monotonic,
            "stopped_at": iso_full(self.stopped_at),
            "stopped_monotonic": self.stopped_monotonic,
            "end": self.end,
            "transitions": [t.to_json() for t in self.transitions],
            "stop_requests": [s.to_json() for s in self.stop_requests],
        }


def iso_full(value: datetime | None) -> str | None:
    """Full-precision ISO 8601 (ground truth keeps microseconds)."""
    return None if value is None else value.astimezone(UTC).isoformat()


def _require_aware(when: datetime) -> None:
    if when.tzinfo is None:
        raise ValueError("times must be timezone-aware")


@dataclass
class _Controls:
    callback: CallbackMode
    ignore_stops: int
    stop_failures: int
    get_error: int | None
    get_delay: float
    get_hang: bool
    get_raw_body: str | None
    report_status: str | None


@dataclass
class _Callback:
    complete_url: str
    fail_url: str
    token: str


@dataclass
class _Run:
    num: int
    path: str
    workflow_id: str
    execution_id: str | None
    body: Any
    callback: _Callback | None
    script: Script
    controls: _Controls
    created_at: datetime
    created_monotonic: float
    status: str = "new"
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    wait_till: datetime | None = None
    phase: str = "new"  # new | work | wait | done | killed
    step: int = 0
    phase_version: int = 0
    stale_version: int = 0
    stale_value: datetime | None = None
    forgotten: bool = False
    truly_stopped_at: datetime | None = None
    truly_stopped_monotonic: float | None = None
    end: str | None = None
    transitions: list[Transition] = field(default_factory=list)
    stop_requests: list[StopRecord] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.num)


@dataclass
class _CallbackJob:
    run_id: str
    execution_id: str | None
    kind: Literal["complete", "fail"]
    url: str
    token: str
    body: Any
    times: int


@dataclass
class _StopAnswer:
    kind: Literal["ok", "unknown", "not_stoppable", "failed"]
    run: dict[str, Any] | None = None
    message: str = ""


# --------------------------------------------------------------------------------------------
# The fake engine


class FakeN8n:
    """The state of a fake n8n: webhooks, runs, sessions, callbacks and ground truth.

    Thread-safe: the served app and the test may call it from different threads.
    """

    def __init__(
        self,
        *,
        version: str = "1.123",
        api_key: str = "fake-n8n-api-key",
        email: str = "owner@example.com",
        password: str = "fake-n8n-password",
        clock: Callable[[], datetime] | None = None,
        latency: float = 0.0,
        first_id: int = 1,
        tick: float = 0.005,
        callback_timeout: float = 5.0,
        rewrite_stopped_at_on_restart: bool = True,
        migrating_for: float = 0.0,
        starting_for: float = 0.0,
    ) -> None:
        self._lock = threading.RLock()
        self._callbacks_changed = threading.Condition(self._lock)
        self.version = version
        self.api_key = api_key
        self.email = email
        self.password = password
        self._clock = clock or _utc_now
        self.latency = latency
        self.tick = tick
        self.callback_timeout = callback_timeout
        self.rewrite_stopped_at_on_restart = rewrite_stopped_at_on_restart
        self._next_num = first_id
        self._seq = 0
        self._webhooks: dict[str, tuple[str, Script]] = {}
        self._queued: dict[str, deque[Script]] = {}
        self._by_execution: dict[str, Script] = {}
        self._runs: dict[int, _Run] = {}
        self._heap: list[tuple[datetime, int, int, str, int]] = []
        self._sessions: dict[str, str | None] = {}
        self._pending_callbacks: deque[_CallbackJob] = deque()
        self._callbacks: list[CallbackAttempt] = []
        self._down = False
        self._killed_at: datetime | None = None
        self._up_since: datetime | None = None
        self._migrating_until: datetime | None = None
        self._starting_until: datetime | None = None
        _check_windows(migrating_for, starting_for)
        self._boot_windows = (migrating_for, starting_for)  # opened when served
        self._runtime: _Runtime | None = None

    # -- settings -----------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        match = re.match(r"^(\d+)\.(\d+)", value)
        if not match:
            raise ValueError(f"version must look like 1.123 or 2.0, not {value!r}")
        self._version = value
        self._major = int(match.group(1))

    @property
    def has_public_stop(self) -> bool:
        """n8n 2.x exposes ``POST /api/v1/executions/{id}/stop``; 1.x does not."""
        return self._major >= 2

    @property
    def down(self) -> bool:
        return self._down

    def now(self) -> datetime:
        value = self._clock()
        _require_aware(value)
        return value

    # -- webhooks and scripts -----------------------------------------------------------------

    def add_webhook(
        self, path: str, script: Script | None = None, *, workflow_id: str | None = None
    ) -> str:
        """Register (or re-register) a production webhook; returns the workflow id."""
        key = _webhook_key(path)
        with self._lock:
            if workflow_id is None:
                existing = self._webhooks.get(key)
                workflow_id = existing[0] if existing else _workflow_id_for(key)
            self._webhooks[key] = (workflow_id, script or Script())
            return workflow_id

    def queue_script(self, path: str, script: Script) -> None:
        """The next trigger of ``path`` (without a script for its execution id) uses ``script``."""
        key = _webhook_key(path)
        with self._lock:
            if key not in self._webhooks:
                raise KeyError(f"no webhook registered at {path!r}")
            self._queued.setdefault(key, deque()).append(script)

    def script_for_execution(self, execution_id: str, script: Script) -> None:
        """Runs triggered for this Veracity execution id use ``script``."""
        with self._lock:
            self._by_execution[execution_id] = script

    # -- triggering -----------------------------------------------------------------------------

    def trigger(self, path: str, body: Any) -> tuple[str | None, Script]:
        """Handle a webhook call: pick the script and start a run unless it refuses.

        Returns ``(run_id or None when refused, script)``. Raises KeyError for an unknown path.
        """
        key = _webhook_key(path)
        with self._lock:
            if key not in self._webhooks:
                raise KeyError(path)
            self._require_up()
            workflow_id, default = self._webhooks[key]
            execution_id = _execution_id_of(body)
            script = self._by_execution.get(execution_id) if execution_id is not None else None
            if script is None:
                queue = self._queued.get(key)
                script = queue.popleft() if queue else default
            if script.respond == "refuse":
                return None, script
            run = self._create_run(key, workflow_id, body, execution_id, script)
            return run.id, script

    def start_runs(self, path: str, bodies: list[Any]) -> list[str]:
        """Start many runs at once without HTTP (benchmarks); refusals are skipped."""
        ids: list[str] = []
        with self._lock:
            for body in bodies:
                run_id, _ = self.trigger(path, body)
                if run_id is not None:
                    ids.append(run_id)
        return ids

    def _create_run(
        self, key: str, workflow_id: str, body: Any, execution_id: str | None, script: Script
    ) -> _Run:
        now = self.now()
        self.advance(now)
        num = self._next_num
        self._next_num += 1
        run = _Run(
            num=num,
            path=key,
            workflow_id=workflow_id,
            execution_id=execution_id,
            body=body,
            callback=_callback_of(body),
            script=script,
            controls=_Controls(
                callback=script.callback,
                ignore_stops=script.ignore_stops,
                stop_failures=script.stop_failures,
                get_error=script.get_error,
                get_delay=script.get_delay,
                get_hang=script.get_hang,
                get_raw_body=script.get_raw_body,
                report_status=script.report_status,
            ),
            created_at=now,
            created_monotonic=time.monotonic(),
        )
        self._runs[num] = run
        self._record(run, "created", now)
        if script.queued_for > 0:
            self._schedule(run, now + timedelta(seconds=script.queued_for))
        else:
            self._start(run, now)
        return run

    # -- the run state machine ----------------------------------------------------------------

    def advance(self, now: datetime | None = None) -> None:
        """Apply every scripted transition due by ``now`` (default: the clock)."""
        with self._lock:
            if now is None:
                now = self.now()
            if self._down:
                return
            while self._heap and self._heap[0][0] <= now:
                deadline, _, num, kind, version = heapq.heappop(self._heap)
                run = self._runs[num]
                at = max(deadline, self._up_since) if self._up_since is not None else deadline
                if kind == "phase" and version == run.phase_version:
                    self._on_deadline(run, at)
                elif kind == "stale" and version == run.stale_version:
                    self._clear_stale(run, at)

    def _push(self, when: datetime, run: _Run, kind: str) -> None:
        self._seq += 1
        version = run.phase_version if kind == "phase" else run.stale_version
        heapq.heappush(self._heap, (when, self._seq, run.num, kind, version))

    def _schedule(self, run: _Run, when: datetime | None) -> None:
        run.phase_version += 1
        if when is not None:
            self._push(when, run, "phase")

    def _start(self, run: _Run, at: datetime) -> None:
        run.started_at = at
        run.status = "running"
        self._record(run, "started", at)
        self._enter_step(run, 0, at)

    def _enter_step(self, run: _Run, index: int, at: datetime) -> None:
        steps = run.script.steps
        run.step = index
        if index >= len(steps):
            self._finish(run, at, run.script.outcome)
            return
        step = steps[index]
        if isinstance(step, Wait) and step.parks():
            run.phase = "wait"
            run.status = "waiting"
            run.stopped_at = at
            run.stale_value = None
            run.stale_version += 1
            if step.seconds is None:
                run.wait_till = WAIT_INDEFINITELY
                self._schedule(run, None)
            else:
                run.wait_till = at + timedelta(seconds=step.seconds)
                self._schedule(run, run.wait_till)
            self._record(run, "waiting", at)
            return
        run.phase = "work"
        if run.status != "running":
            run.status = "running"
            self._record(run, "running", at)
        seconds = step.seconds
        if seconds is None or math.isinf(seconds):
            self._schedule(run, None)
        else:
            self._schedule(run, at + timedelta(seconds=seconds))

    def _on_deadline(self, run: _Run, at: datetime) -> None:
        if run.phase == "new":
            self._start(run, at)
        elif run.phase == "work":
            self._enter_step(run, run.step + 1, at)
        elif run.phase == "wait":
            self._resume(run, at)

    def _resume(self, run: _Run, at: datetime) -> None:
        step = run.script.steps[run.step]
        assert isinstance(step, Wait)
        run.status = "running"
        run.started_at = at
        run.wait_till = None
        run.phase = "work"
        run.stale_value = run.stopped_at
        run.stale_version += 1
        self._record(run, "resumed", at)
        if step.stale_stopped_for > 0:
            self._push(at + timedelta(seconds=step.stale_stopped_for), run, "stale")
        else:
            self._clear_stale(run, at)
        self._enter_step(run, run.step + 1, at)

    def _clear_stale(self, run: _Run, at: datetime) -> None:
        if run.status == "running" and run.stale_value is not None:
            if run.stopped_at == run.stale_value:
                run.stopped_at = None
                self._record(run, "stale_cleared", at)
        run.stale_value = None

    def _finish(
        self,
        run: _Run,
        at: datetime,
        outcome: str,
        *,
        result: Any = None,
        error: Any = None,
        override: bool = False,
    ) -> None:
        if outcome == "keep_running":
            run.phase = "work"
            if run.status != "running":
                run.status = "running"
                self._record(run, "running", at)
            self._schedule(run, None)
            return
        run.phase = "done"
        run.phase_version += 1
        run.stale_version += 1
        run.stale_value = None
        if outcome == "forget":
            run.forgotten = True
            self._truly_stop(run, at, "forgotten")
            self._record(run, "forgotten", at)
            return
        status = {"success": "success", "error": "error", "crash": "crashed"}[outcome]
        run.status = status
        run.stopped_at = at
        run.wait_till = None
        self._truly_stop(run, at, status)
        self._record(run, status, at)
        if outcome == "success":
            value = result if override else run.script.result
            self._queue_callback(run, "complete", {"result": value})
        elif outcome == "error":
            body: dict[str, Any] = {"error": error if override else run.script.error}
            if run.script.transient is not None:
                body["transient"] = run.script.transient
            self._queue_callback(run, "fail", body)

    def _truly_stop(self, run: _Run, at: datetime, reason: str) -> None:
        if run.truly_stopped_at is None:
            run.truly_stopped_at = at
            run.truly_stopped_monotonic = time.monotonic()
            run.end = reason

    def _record(self, run: _Run, event: str, at: datetime) -> None:
        run.transitions.append(
            Transition(event, at, time.monotonic(), run.status, run.stopped_at, run.wait_till)
        )

    def _queue_callback(self, run: _Run, kind: Literal["complete", "fail"], body: Any) -> None:
        mode = run.controls.callback
        if run.callback is None:
            self._record(run, "callback_missing", run.truly_stopped_at or self.now())
            return
        if mode == "lose":
            self._record(run, "callback_lost", run.truly_stopped_at or self.now())
            return
        url = run.callback.complete_url if kind == "complete" else run.callback.fail_url
        times = 2 if mode == "duplicate" else 1
        self._pending_callbacks.append(
            _CallbackJob(run.id, run.execution_id, kind, url, run.callback.token, body, times)
        )

    # -- operations on runs -------------------------------------------------------------------

    def _require_up(self) -> None:
        if self._down:
            raise RuntimeError("the fake n8n is down (kill() without start())")

    def _get(self, run_id: str) -> _Run:
        run = self._runs.get(int(run_id)) if run_id.isdigit() else None
        if run is None:
            raise KeyError(f"no run {run_id!r}")
        return run

    def resume(self, run_id: str) -> None:
        """Resume a waiting run now (a webhook wait, or a timed one early)."""
        with self._lock:
            self._require_up()
            now = self.now()
            self.advance(now)
            run = self._get(run_id)
            if run.forgotten or run.phase != "wait":
                raise ValueError(f"run {run_id} is not waiting (status {run.status})")
            self._resume(run, now)

    def finish(
        self,
        run_id: str,
        outcome: Outcome = "success",
        *,
        result: Any = None,
        error: Any = "scripted failure",
    ) -> None:
        """End a run now as if its script said so (e.g. a ``keep_running`` run)."""
        if outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be one of {_OUTCOMES}")
        with self._lock:
            self._require_up()
            now = self.now()
            self.advance(now)
            run = self._get(run_id)
            if run.phase in ("done", "killed") or run.forgotten:
                raise ValueError(f"run {run_id} already ended ({run.status})")
            if run.started_at is None:
                run.started_at = now
            self._finish(run, now, outcome, result=result, error=error, override=True)

    def forget(self, run_id: str) -> None:
        """Make the engine forget a run: 404 from now on; a run still going stops here."""
        with self._lock:
            now = self.now()
            self.advance(now)
            run = self._get(run_id)
            if run.forgotten:
                return
            run.forgotten = True
            run.phase_version += 1
            run.stale_version += 1
            if run.phase not in ("done", "killed"):
                run.phase = "done"
            self._truly_stop(run, now, "forgotten")
            self._record(run, "forgotten", now)

    def control(
        self,
        run_id: str,
        *,
        callback: CallbackMode | None = None,
        ignore_stops: int | None = None,
        stop_failures: int | None = None,
        get_error: int | Literal[False] | None = False,
        get_delay: float | None = None,
        get_hang: bool | None = None,
        get_raw_body: str | Literal[False] | None = False,
        report_status: str | Literal[False] | None = False,
    ) -> None:
        """Change a run's misbehaviours. For the nullable ones, False means "leave as is"."""
        with self._lock:
            c = self._get(run_id).controls
            if callback is not None:
                if callback not in _CALLBACK_MODES:
                    raise ValueError(f"callback must be one of {_CALLBACK_MODES}")
                c.callback = callback
            if ignore_stops is not None:
                c.ignore_stops = ignore_stops
            if stop_failures is not None:
                c.stop_failures = stop_failures
            if get_error is not False:
                c.get_error = get_error
            if get_delay is not None:
                c.get_delay = get_delay
            if get_hang is not None:
                c.get_hang = get_hang
            if get_raw_body is not False:
                c.get_raw_body = get_raw_body
            if report_status is not False:
                c.report_status = report_status

    def _controls(self, run_id: str) -> _Controls | None:
        with self._lock:
            run = self._runs.get(int(run_id)) if run_id.isdigit() else None
            return None if run is None else replace(run.controls)

    def stop(self, run_id: str, *, via: str = "python") -> _StopAnswer:
        """What n8n's ExecutionService.stop does for this id (and the scripted misbehaviour)."""
        with self._lock:
            self._require_up()
            now = self.now()
            self.advance(now)
            run = self._runs.get(int(run_id)) if run_id.isdigit() else None
            if run is None or run.forgotten:
                return _StopAnswer("unknown", message="Failed to find execution to stop")
            mono = time.monotonic()
            if run.status not in STOPPABLE:
                run.stop_requests.append(StopRecord(now, mono, via, "refused"))
                return _StopAnswer(
                    "not_stoppable",
                    message=(
                        f"Only running or waiting executions can be stopped and {run.id} "
                        f"is currently {run.status}"
                    ),
                )
            if run.controls.stop_failures > 0:
                run.controls.stop_failures -= 1
                run.stop_requests.append(StopRecord(now, mono, via, "failed"))
                self._record(run, "stop_failed", now)
                return _StopAnswer("failed", message="fake n8n: scripted stop failure")
            if run.controls.ignore_stops > 0:
                run.controls.ignore_stops -= 1
                run.stop_requests.append(StopRecord(now, mono, via, "ignored"))
                self._record(run, "stop_ignored", now)
                claimed = {
                    "mode": "webhook",
                    "startedAt": iso(run.started_at),
                    "stoppedAt": iso(now),
                    "finished": False,
                    "status": "canceled",
                }
                return _StopAnswer("ok", run=claimed)
            run.phase = "done"
            run.phase_version += 1
            run.stale_version += 1
            run.stale_value = None
            run.status = "canceled"
            run.stopped_at = now
            run.wait_till = None
            if run.started_at is None:
                run.started_at = now
            self._truly_stop(run, now, "canceled")
            run.stop_requests.append(StopRecord(now, mono, via, "stopped"))
            self._record(run, "canceled", now)
            return _StopAnswer(
                "ok",
                run={
                    "mode": "webhook",
                    "startedAt": iso(run.started_at),
                    "stoppedAt": iso(run.stopped_at),
                    "finished": False,
                    "status": "canceled",
                },
            )

    # -- restart --------------------------------------------------------------------------------

    def kill(self) -> None:
        """The engine dies: running runs really stop now but still read running until start."""
        with self._lock:
            now = self.now()
            self.advance(now)
            if self._down:
                return
            self._down = True
            self._killed_at = now
            for run in self._runs.values():
                if run.phase in ("new", "work") and not run.forgotten:
                    run.phase = "killed"
                    run.phase_version += 1
                    run.stale_version += 1
                    self._truly_stop(run, now, "killed")
                    self._record(run, "killed", now)

    def start(self, *, starting_for: float = 0.0, migrating_for: float = 0.0) -> None:
        """The engine comes back: killed runs read crashed; waiting runs survive.

        ``stoppedAt`` of waiting and crashed runs is rewritten to now (unless
        ``rewrite_stopped_at_on_restart`` is False). For ``migrating_for`` seconds every route
        but ``/healthz`` answers 200 ``n8n is starting up. Please wait``; for ``starting_for``
        seconds after that, 404 ``Cannot <METHOD> <path>`` (Express's page: no route mounted).
        """
        _check_windows(migrating_for, starting_for)
        with self._lock:
            if not self._down:
                return
            now = self.now()
            self._down = False
            self._up_since = now
            self._open_windows(now, migrating_for, starting_for)
            for run in self._runs.values():
                if run.forgotten:
                    continue
                if run.phase == "killed":
                    run.phase = "done"
                    run.status = "crashed"
                    run.stopped_at = now
                    run.wait_till = None
                    self._record(run, "crashed", now)
                elif self.rewrite_stopped_at_on_restart and run.status in ("waiting", "crashed"):
                    run.stopped_at = now
                    self._record(run, "stopped_at_rewritten", now)
            self.advance(now)

    def restart(self, *, starting_for: float = 0.0, migrating_for: float = 0.0) -> None:
        """Kill, then start at once."""
        _check_windows(migrating_for, starting_for)
        with self._lock:
            self.kill()
            self.start(starting_for=starting_for, migrating_for=migrating_for)

    def phase(self) -> Literal["down", "migrating", "starting", "up"]:
        """Where the engine is: killed, migrating, up without its routes, or up."""
        with self._lock:
            if self._down:
                return "down"
            now = self.now()
            if self._migrating_until is not None and now < self._migrating_until:
                return "migrating"
            if self._starting_until is not None and now < self._starting_until:
                return "starting"
            return "up"

    def _open_windows(self, now: datetime, migrating_for: float, starting_for: float) -> None:
        migrated = now + timedelta(seconds=migrating_for)
        self._migrating_until = migrated if migrating_for else None
        self._starting_until = migrated + timedelta(seconds=starting_for) if starting_for else None

    # -- sessions -------------------------------------------------------------------------------

    def login(self, email: str, password: str, browser_id: str | None) -> str | None:
        """A session token bound to ``browser_id``, or None for wrong credentials."""
        ok = secrets.compare_digest(email.encode(), self.email.encode()) and (
            secrets.compare_digest(password.encode(), self.password.encode())
        )
        if not ok:
            return None
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._sessions[token] = _hash(browser_id) if browser_id else None
        return token

    def session_ok(self, token: str | None, browser_id: str | None) -> bool:
        """n8n's check: a known token, and the browser-id it was issued for (if any)."""
        if not token:
            return False
        with self._lock:
            if token not in self._sessions:
                return False
            bound = self._sessions[token]
        return bound is None or (browser_id is not None and bound == _hash(browser_id))

    # -- views ----------------------------------------------------------------------------------

    def execution(self, run_id: str, *, include_data: bool = False) -> dict[str, Any] | None:
        """What ``GET /api/v1/executions/{id}`` shows now (None: 404)."""
        with self._lock:
            self.advance()
            run = self._runs.get(int(run_id)) if run_id.isdigit() else None
            if run is None or run.forgotten:
                return None
            return self._execution_json(run, include_data)

    def _execution_json(self, run: _Run, include_data: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": run.id,
            "finished": run.status == "success",
            "mode": "webhook",
            "retryOf": None,
            "retrySuccessId": None,
            "status": run.status,
            "createdAt": iso(run.created_at),
            "startedAt": iso(run.started_at),
            "stoppedAt": iso(run.stopped_at),
            "deletedAt": None,
            "workflowId": run.workflow_id,
            "waitTill": iso(run.wait_till),
            "storedAt": "db",
        }
        if include_data:
            result_data: dict[str, Any] = {"runData": {}}
            if run.status == "error":
                result_data["error"] = {"message": str(run.script.error)}
            out["data"] = {"resultData": result_data}
        return out

    def list_executions(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        limit: int = 100,
        last_id: int | None = None,
        include_data: bool = False,
    ) -> tuple[list[dict[str, Any]], int | None]:
        """The public listing: newest first, without runs held in memory. Returns the page and
        the last id when more follow."""
        with self._lock:
            self.advance()
            page: list[dict[str, Any]] = []
            more = False
            for num in sorted(self._runs, reverse=True):
                if last_id is not None and num >= last_id:
                    continue
                run = self._runs[num]
                if run.forgotten or run.status in IN_MEMORY:
                    continue
                if status is not None and run.status != status:
                    continue
                if workflow_id is not None and run.workflow_id != workflow_id:
                    continue
                if len(page) == limit:
                    more = True
                    break
                page.append(self._execution_json(run, include_data))
            return page, (int(page[-1]["id"]) if more and page else None)

    def truth(self, run_id: str) -> RunTruth:
        with self._lock:
            self.advance()
            return self._truth(self._get(run_id))

    def _truth(self, run: _Run) -> RunTruth:
        return RunTruth(
            run_id=run.id,
            execution_id=run.execution_id,
            path=run.path,
            workflow_id=run.workflow_id,
            status=run.status,
            forgotten=run.forgotten,
            started_at=run.created_at,
            started_monotonic=run.created_monotonic,
            stopped_at=run.truly_stopped_at,
            stopped_monotonic=run.truly_stopped_monotonic,
            end=run.end,
            transitions=tuple(run.transitions),
            stop_requests=tuple(run.stop_requests),
            trigger_body=run.body,
        )

    def truths(self) -> list[RunTruth]:
        with self._lock:
            self.advance()
            return [self._truth(r) for r in self._runs.values()]

    def runs_for_execution(self, execution_id: str) -> list[RunTruth]:
        """Every run triggered for this Veracity execution id (more than one: started twice)."""
        return [t for t in self.truths() if t.execution_id == execution_id]

    def is_running_at(self, run_id: str, when: datetime) -> bool:
        """Whether the run was still going (running, waiting or new) at ``when``."""
        return self.truth(run_id).is_going_at(when)

    def truthful_violations(
        self,
        terminal_at: Mapping[str, datetime],
        *,
        key: Literal["execution_id", "run_id"] = "execution_id",
    ) -> list[str]:
        """Check "no execution is terminal in Veracity while its run is still going".

        ``terminal_at`` maps Veracity execution ids (or run ids, ``key="run_id"``) to the time
        Veracity recorded a terminal state. Every run of that execution must have really stopped
        at or before that time. Returns one line per violation (empty: the invariant held).
        """
        problems: list[str] = []
        truths = self.truths()
        for ident, when in terminal_at.items():
            _require_aware(when)
            for t in truths:
                if (t.execution_id if key == "execution_id" else t.run_id) != ident:
                    continue
                if t.stopped_at is None or t.stopped_at > when:
                    stopped = (
                        "is still going"
                        if t.stopped_at is None
                        else (f"really stopped at {iso_full(t.stopped_at)}")
                    )
                    problems.append(
                        f"{key} {ident}: terminal in Veracity at {iso_full(when)} but run "
                        f"{t.run_id} {stopped} (status {t.status})"
                    )
        return problems

    # -- callbacks ------------------------------------------------------------------------------

    def callbacks(self) -> list[CallbackAttempt]:
        with self._lock:
            return list(self._callbacks)

    def wait_for_callbacks(self, count: int, timeout: float = 5.0) -> list[CallbackAttempt]:
        """Block until at least ``count`` callback attempts were made (TimeoutError if not)."""
        deadline = time.monotonic() + timeout
        with self._callbacks_changed:
            while len(self._callbacks) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(self._callbacks)} callback attempts after {timeout} s, "
                        f"wanted {count}"
                    )
                self._callbacks_changed.wait(left)
            return list(self._callbacks)

    def _drain_callbacks(self) -> list[_CallbackJob]:
        with self._lock:
            jobs = list(self._pending_callbacks)
            self._pending_callbacks.clear()
            return jobs

    def _record_callback(self, attempt: CallbackAttempt) -> None:
        with self._callbacks_changed:
            self._callbacks.append(attempt)
            self._callbacks_changed.notify_all()

    # -- serving --------------------------------------------------------------------------------

    def release_hangs(self) -> None:
        """Let every hanging request answer (503) now; called before a served app stops."""
        runtime = self._runtime
        if runtime is not None:
            runtime.release_threadsafe()

    def _attach(self, runtime: _Runtime) -> None:
        with self._lock:
            if self._runtime is not None:
                raise RuntimeError("this FakeN8n is already being served")
            self._runtime = runtime
            if any(self._boot_windows) and not self._down:
                self._open_windows(self.now(), *self._boot_windows)

    def _detach(self, runtime: _Runtime) -> None:
        with self._lock:
            if self._runtime is runtime:
                self._runtime = None


def _check_windows(*seconds: float) -> None:
    for value in seconds:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"a start-up window is a number of seconds, not {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a start-up window cannot be {value!r} seconds")


def _webhook_key(path: str) -> str:
    key = path.strip()
    for prefix in ("/webhook-test/", "/webhook/", "webhook-test/", "webhook/"):
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    key = key.strip("/")
    if not key:
        raise ValueError(f"empty webhook path {path!r}")
    return key


_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _workflow_id_for(key: str) -> str:
    """A stable 16-character id like n8n's (e.g. ``cfwWwcRoLtI253lD``)."""
    digest = hashlib.sha256(key.encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:16])


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _execution_id_of(body: Any) -> str | None:
    if isinstance(body, dict):
        value = body.get("execution_id")
        if isinstance(value, str):
            return value
    return None


def _callback_of(body: Any) -> _Callback | None:
    if not isinstance(body, dict):
        return None
    cb = body.get("callback")
    if not isinstance(cb, dict):
        return None
    complete, fail, token = cb.get("complete_url"), cb.get("fail_url"), cb.get("token")
    if isinstance(complete, str) and isinstance(fail, str) and isinstance(token, str):
        return _Callback(complete, fail, token)
    return None


# --------------------------------------------------------------------------------------------
# The served app


class _Runtime:
    """What exists only while the app is served: the loop, the hang latch, the ticker and the
    callback sender."""

    def __init__(self, fake: FakeN8n) -> None:
        self.fake = fake
        self.loop = asyncio.get_running_loop()
        self.released = asyncio.Event()
        self.client = httpx.AsyncClient(timeout=fake.callback_timeout)
        self.tasks: set[asyncio.Task[None]] = set()
        self.ticker = asyncio.create_task(self._tick())

    def release_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            self.loop.call_soon_threadsafe(self.released.set)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.fake.tick)
            self.fake.advance()
            self.flush()

    def flush(self) -> None:
        for job in self.fake._drain_callbacks():
            task = asyncio.create_task(self._send(job))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send(self, job: _CallbackJob) -> None:
        for attempt in range(1, job.times + 1):
            status: int | None = None
            error: str | None = None
            try:
                response = await self.client.post(
                    job.url, json=job.body, headers={"Authorization": f"Bearer {job.token}"}
                )
                status = response.status_code
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            self.fake._record_callback(
                CallbackAttempt(
                    run_id=job.run_id,
                    execution_id=job.execution_id,
                    kind=job.kind,
                    url=job.url,
                    body=job.body,
                    attempt=attempt,
                    at=self.fake.now(),
                    status_code=status,
                    error=error,
                )
            )

    async def hang(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (None: forever). True if released early (shutting down)."""
        if seconds is None:
            await self.released.wait()
            return True
        try:
            await asyncio.wait_for(self.released.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self.released.set()
        self.ticker.cancel()
        tasks = [self.ticker, *self.tasks]
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


_DOWN = {"code": 503, "message": "n8n is down (fake n8n: simulated restart)"}
STARTING_UP_TEXT = "n8n is starting up. Please wait"
"""n8n's answer to every route but /healthz while its database migrations run."""


def express_not_found(request: Request) -> Response:
    """Express's default 404 (its final handler) for a route nothing is mounted on: the HTML
    page ``Cannot <METHOD> <path>``, what n8n answers while it starts."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else request.url.path
    path = path.split("?", 1)[0]
    message = _escape_html(f"Cannot {request.method} {path}")
    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>Error</title>\n</head>\n<body>\n<pre>{message}</pre>\n</body>\n</html>\n"
    )
    headers = {"Content-Security-Policy": "default-src 'none'", "X-Content-Type-Options": "nosniff"}
    return Response(page, status_code=404, media_type="text/html", headers=headers)


def _escape_html(text: str) -> str:
    for char, entity in (
        ("&", "&amp;"),
        ("<", "&lt;"),
        (">", "&gt;"),
        ('"', "&quot;"),
        ("'", "&#39;"),
    ):
        text = text.replace(char, entity)
    return text.replace("\n", "<br>").replace("  ", " &nbsp;")


_NUMERIC = re.compile(r"^\d+$")


class _App:
    def __init__(self, fake: FakeN8n) -> None:
        self.fake = fake

    # -- plumbing -----------------------------------------------------------------------------

    def runtime(self) -> _Runtime | None:
        return self.fake._runtime

    async def hang(self, seconds: float | None) -> bool:
        runtime = self.runtime()
        if runtime is None:  # not served through the lifespan: just wait
            await asyncio.sleep(seconds if seconds is not None else 3600.0)
            return False
        return await runtime.hang(seconds)

    async def enter(self, request: Request) -> Response | None:
        """Latency first, then the engine's availability: down, migrating, or up without its
        routes (``/healthz`` is not gated: n8n registers it before it migrates)."""
        if self.fake.latency > 0:
            await asyncio.sleep(self.fake.latency)
        phase = self.fake.phase()
        if phase == "down":
            return _json(503, _DOWN)
        if phase == "migrating":
            # n8n's gate: Express's res.send of a string, 200 text/html.
            return PlainTextResponse(STARTING_UP_TEXT, media_type="text/html")
        if phase == "starting":
            return express_not_found(request)
        return None

    def api_key_error(self, request: Request) -> Response | None:
        key = request.headers.get("x-n8n-api-key")
        if key is None:
            return _json(401, {"message": "'X-N8N-API-KEY' header required"})
        if not secrets.compare_digest(key.encode(), self.fake.api_key.encode()):
            return _json(401, {"message": "unauthorized"})
        return None

    def flush(self) -> None:
        runtime = self.runtime()
        if runtime is not None:
            runtime.flush()

    # -- engine endpoints ---------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        if self.fake.latency > 0:
            await asyncio.sleep(self.fake.latency)
        if self.fake.down:
            return _json(503, _DOWN)
        return _json(200, {"status": "ok"})

    async def webhook(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        path = request.path_params["path"]
        test = request.url.path.startswith("/webhook-test/")
        method = request.method
        try:
            key = _webhook_key(path)
            registered = key in self.fake._webhooks
        except ValueError:
            registered = False
        if not registered:
            hint = (
                "Click the 'Execute workflow' button on the canvas, then try again. (In test "
                "mode, the webhook only works for one call after you click this button)"
                if test
                else "The workflow must be active for a production URL to run successfully. You "
                "can activate the workflow using the toggle in the top-right of the editor. Note "
                "that unlike test URL calls, production URL calls aren't shown on the canvas "
                "(only in the executions list)"
            )
            return _json(
                404,
                {
                    "code": 404,
                    "message": f'The requested webhook "{method} {path}" is not registered.',
                    "hint": hint,
                },
            )
        if method != "POST":
            return _json(
                404,
                {
                    "code": 404,
                    "message": f"This webhook is not registered for {method} requests. "
                    "Did you mean to make a POST request?",
                },
            )
        raw = await request.body()
        body: Any
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = raw.decode("utf-8", "replace")
        run_id, script = self.fake.trigger(path, body)
        self.flush()
        if run_id is None:
            if isinstance(script.refuse_body, str):
                return PlainTextResponse(script.refuse_body, status_code=script.refuse_status)
            return _json(script.refuse_status, script.refuse_body)
        if script.respond == "hang":
            if await self.hang(None):
                return _json(503, {"code": 503, "message": "fake n8n shutting down"})
        elif script.respond_delay > 0:
            await self.hang(script.respond_delay)
        if script.respond == "default":
            return _json(200, {"message": "Workflow was started"})
        return _json(200, {"executionId": run_id})

    async def webhook_waiting(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        run_id = request.path_params["id"]
        execution = self.fake.execution(run_id)
        if execution is None:
            return _json(404, {"code": 404, "message": f'The execution "{run_id}" does not exist.'})
        if execution["status"] not in IN_MEMORY:
            return _json(
                409, {"code": 409, "message": f'The execution "{run_id}" has finished already.'}
            )
        if execution["status"] != "waiting" or execution["waitTill"] != iso(WAIT_INDEFINITELY):
            message = f"fake n8n: execution {run_id} is not waiting for a webhook"
            return _json(409, {"code": 409, "message": message})
        try:
            self.fake.resume(run_id)
        except ValueError as exc:
            return _json(409, {"code": 409, "message": str(exc)})
        return _json(200, {})

    async def get_execution(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        denied = self.api_key_error(request)
        if denied is not None:
            return denied
        run_id = request.path_params["id"]
        if not _NUMERIC.match(run_id):
            return _json(400, {"message": "request/params/id must be number"})
        include = request.query_params.get("includeData", "false").lower() == "true"
        controls = self.fake._controls(run_id)
        if controls is not None and self.fake.execution(run_id) is not None:
            if controls.get_hang:
                await self.hang(None)
                return _json(503, {"code": 503, "message": "fake n8n shutting down"})
            if controls.get_delay > 0:
                await self.hang(controls.get_delay)
            if controls.get_error is not None:
                phrase = _phrase(controls.get_error)
                return _json(controls.get_error, {"code": controls.get_error, "message": phrase})
            if controls.get_raw_body is not None:
                return Response(controls.get_raw_body, media_type="application/json")
        execution = self.fake.execution(run_id, include_data=include)
        self.flush()
        if execution is None:
            return _json(404, {"message": "Not Found"})
        if controls is not None and controls.report_status is not None:
            execution["status"] = controls.report_status
        return _json(200, execution)

    async def list_executions(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        denied = self.api_key_error(request)
        if denied is not None:
            return denied
        q = request.query_params
        status = q.get("status")
        if status is not None and status not in LIST_STATUS_FILTER:
            allowed = ", ".join(LIST_STATUS_FILTER)
            return _json(
                400,
                {
                    "message": "request/query/status must be equal to one of the allowed "
                    f"values: {allowed}"
                },
            )
        try:
            limit = int(q.get("limit", "100"))
        except ValueError:
            return _json(400, {"message": "request/query/limit must be number"})
        if limit > 250:
            return _json(400, {"message": "request/query/limit must be <= 250"})
        if limit < 1:
            return _json(400, {"message": "request/query/limit must be >= 1"})
        last_id: int | None = None
        cursor = q.get("cursor")
        if cursor:
            try:
                decoded = json.loads(base64.b64decode(cursor))
                last_id = int(decoded["lastId"])
                limit = int(decoded.get("limit", limit))
            except (ValueError, KeyError, TypeError):
                return _json(400, {"message": "An invalid cursor was provided"})
        include = q.get("includeData", "false").lower() == "true"
        page, more_after = self.fake.list_executions(
            status=status,
            workflow_id=q.get("workflowId"),
            limit=limit,
            last_id=last_id,
            include_data=include,
        )
        next_cursor = None
        if more_after is not None:
            next_cursor = base64.b64encode(
                json.dumps({"lastId": str(more_after), "limit": limit}).encode()
            ).decode()
        return _json(200, {"data": page, "nextCursor": next_cursor})

    async def public_stop(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        if not self.fake.has_public_stop:
            # n8n 1.x: no such route; the API router answers before checking the key.
            return _json(404, {"message": "not found"})
        denied = self.api_key_error(request)
        if denied is not None:
            return denied
        run_id = request.path_params["id"]
        if not _NUMERIC.match(run_id):
            return _json(400, {"message": "request/params/id must be number"})
        answer = self.fake.stop(run_id, via="public")
        self.flush()
        if answer.kind == "ok":
            return _json(200, answer.run)
        if answer.kind == "unknown":
            return _json(404, {"message": "Not Found"})
        return _json(500, {"message": answer.message})

    async def rest_login(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        try:
            payload = json.loads(await request.body())
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return _json(400, {"code": 400, "message": "Request body is not valid JSON"})
        email, password = payload.get("emailOrLdapLoginId"), payload.get("password")
        if not isinstance(email, str) or not isinstance(password, str):
            return _json(
                400, {"code": 400, "message": "emailOrLdapLoginId and password are required"}
            )
        if "@" not in email:
            return _json(400, {"code": 400, "message": "Invalid email address"})
        token = self.fake.login(email, password, request.headers.get("browser-id"))
        if token is None:
            return _json(
                401,
                {"code": 401, "message": "Wrong username or password. Do you have caps lock on?"},
            )
        response = _json(
            200,
            {
                "data": {
                    "id": "00000000-0000-4000-8000-000000000001",
                    "email": self.fake.email,
                    "firstName": "Fake",
                    "lastName": "Owner",
                    "role": "global:owner",
                }
            },
        )
        response.set_cookie(AUTH_COOKIE, token, max_age=7 * 24 * 3600, httponly=True)
        return response

    async def rest_stop(self, request: Request) -> Response:
        early = await self.enter(request)
        if early is not None:
            return early
        token = request.cookies.get(AUTH_COOKIE)
        if not self.fake.session_ok(token, request.headers.get("browser-id")):
            return _json(401, {"status": "error", "message": "Unauthorized"})
        answer = self.fake.stop(request.path_params["id"], via="rest")
        self.flush()
        if answer.kind == "ok":
            return _json(200, {"data": answer.run})
        return _json(500, {"code": 0, "message": answer.message})

    async def api_not_found(self, request: Request) -> Response:
        early = await self.enter(request)
        return early or _json(404, {"message": "not found"})

    # -- control API --------------------------------------------------------------------------

    async def control(self, request: Request) -> Response:
        try:
            return await self._control(request)
        except KeyError as exc:
            return _json(404, {"error": str(exc.args[0]) if exc.args else "not found"})
        except (ValueError, TypeError) as exc:
            return _json(400, {"error": str(exc)})

    async def _control(self, request: Request) -> Response:
        fake = self.fake
        name = request.path_params["name"]
        method = request.method
        raw = await request.body()
        data: Any = json.loads(raw) if raw else {}
        if not isinstance(data, dict):
            raise ValueError("the body is a JSON object")
        parts = name.strip("/").split("/")
        if name == "health" and method == "GET":
            return _json(
                200, {"ok": True, "version": fake.version, "down": fake.down, "phase": fake.phase()}
            )
        if name == "webhooks" and method == "POST":
            script = Script.from_json(_obj(data, "script")) if data.get("script") else None
            path = _str(data, "path")
            workflow_id = fake.add_webhook(path, script, workflow_id=data.get("workflow_id"))
            return _json(200, {"path": _webhook_key(path), "workflowId": workflow_id})
        if name == "webhooks/next" and method == "POST":
            fake.queue_script(_str(data, "path"), Script.from_json(_obj(data, "script")))
            return _json(200, {"queued": True})
        if name == "scripts/by-execution" and method == "POST":
            script = Script.from_json(_obj(data, "script"))
            fake.script_for_execution(_str(data, "execution_id"), script)
            return _json(200, {"ok": True})
        if name == "runs" and method == "GET":
            return _json(200, {"runs": [t.to_json() for t in fake.truths()]})
        if parts[0] == "runs" and len(parts) >= 2:
            run_id = parts[1]
            if len(parts) == 2 and method == "GET":
                return _json(200, fake.truth(run_id).to_json())
            if len(parts) == 2 and method == "PATCH":
                _patch_controls(fake, run_id, data)
                return _json(200, fake.truth(run_id).to_json())
            action = parts[2] if len(parts) == 3 else ""
            if action == "resume" and method == "POST":
                fake.resume(run_id)
            elif action == "finish" and method == "POST":
                outcome = data.get("outcome", "success")
                if outcome not in _OUTCOMES:
                    raise ValueError(f"outcome must be one of {_OUTCOMES}")
                fake.finish(
                    run_id,
                    cast(Outcome, outcome),
                    result=data.get("result"),
                    error=data.get("error", "scripted failure"),
                )
            elif action == "forget" and method == "POST":
                fake.forget(run_id)
            else:
                return _json(404, {"error": f"no control endpoint {method} /_fake/{name}"})
            self.flush()
            return _json(200, fake.truth(run_id).to_json())
        if name in ("kill", "start", "restart") and method == "POST":
            windows = {key: data.get(key, 0.0) for key in ("starting_for", "migrating_for")}
            if name == "kill":
                fake.kill()
            elif name == "start":
                fake.start(**windows)
            else:
                fake.restart(**windows)
            self.flush()
            return _json(200, {"down": fake.down})
        if name == "callbacks" and method == "GET":
            return _json(200, {"callbacks": [c.to_json() for c in fake.callbacks()]})
        if name == "settings" and method == "PATCH":
            if "latency" in data:
                fake.latency = float(data["latency"])
            if "version" in data:
                fake.version = str(data["version"])
            return _json(200, {"latency": fake.latency, "version": fake.version})
        if name == "violations" and method == "POST":
            raw_map = data.get("terminal_at")
            if not isinstance(raw_map, dict):
                raise ValueError("terminal_at is an object of execution id -> ISO time")
            key = data.get("key", "execution_id")
            if key not in ("execution_id", "run_id"):
                raise ValueError("key is execution_id or run_id")
            terminal = {str(k): parse_iso(str(v)) for k, v in raw_map.items()}
            return _json(200, {"violations": fake.truthful_violations(terminal, key=key)})
        return _json(404, {"error": f"no control endpoint {method} /_fake/{name}"})


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} is a string")
    return value


def _obj(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} is a JSON object")
    return value


def _patch_controls(fake: FakeN8n, run_id: str, data: Mapping[str, Any]) -> None:
    allowed = {
        "callback",
        "ignore_stops",
        "stop_failures",
        "get_error",
        "get_delay",
        "get_hang",
        "get_raw_body",
        "report_status",
    }
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"unknown run controls: {sorted(unknown)}")
    fake.control(
        run_id,
        callback=data.get("callback"),
        ignore_stops=data.get("ignore_stops"),
        stop_failures=data.get("stop_failures"),
        get_error=data["get_error"] if "get_error" in data else False,
        get_delay=data.get("get_delay"),
        get_hang=data.get("get_hang"),
        get_raw_body=data["get_raw_body"] if "get_raw_body" in data else False,
        report_status=data["report_status"] if "report_status" in data else False,
    )


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def create_app(fake: FakeN8n) -> Starlette:
    """The ASGI app serving ``fake``. Its lifespan runs the ticker and the callback sender."""
    app = _App(fake)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        runtime = _Runtime(fake)
        fake._attach(runtime)
        try:
            yield
        finally:
            fake._detach(runtime)
            await runtime.close()

    webhook_methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]
    routes = [
        Route("/healthz", app.healthz, methods=["GET"]),
        Route("/webhook/{path:path}", app.webhook, methods=webhook_methods),
        Route("/webhook-test/{path:path}", app.webhook, methods=webhook_methods),
        Route("/webhook-waiting/{id}", app.webhook_waiting, methods=["POST", "GET"]),
        Route("/api/v1/executions", app.list_executions, methods=["GET"]),
        Route("/api/v1/executions/{id}", app.get_execution, methods=["GET"]),
        Route("/api/v1/executions/{id}/stop", app.public_stop, methods=["POST"]),
        Route("/api/v1/{rest:path}", app.api_not_found, methods=webhook_methods),
        Route("/rest/login", app.rest_login, methods=["POST"]),
        Route("/rest/executions/{id}/stop", app.rest_stop, methods=["POST"]),
        Route("/_fake/{name:path}", app.control, methods=["GET", "POST", "PATCH", "PUT"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


# --------------------------------------------------------------------------------------------
# Serving in a thread


def serve_asgi_in_thread(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    before_stop: Callable[[], None] | None = None,
    startup_timeout: float = 10.0,
) -> tuple[str, Callable[[], None]]:
    """Serve any ASGI app with uvicorn on a background thread.

    Returns ``(base_url, stop)``. ``stop()`` (idempotent) calls ``before_stop``, asks the server
    to exit, joins the thread and closes the socket.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def target() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"asgi-{host}:{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            sock.close()
            raise RuntimeError(f"the server did not start: {failure or 'timeout'}")
        time.sleep(0.005)
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        if before_stop is not None:
            before_stop()
        server.should_exit = True
        thread.join(15)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("the server thread did not stop")

    return f"http://{host}:{bound_port}", stop


def serve_in_thread(
    fake: FakeN8n, *, host: str = "127.0.0.1", port: int = 0
) -> tuple[str, Callable[[], None]]:
    """Serve ``fake`` on a free loopback port. Returns ``(base_url, stop)``."""
    return serve_asgi_in_thread(
        create_app(fake), host=host, port=port, before_stop=fake.release_hangs
    )


@contextlib.contextmanager
def running(fake: FakeN8n, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """``with running(fake) as base_url: ...`` serves ``fake`` for the block."""
    base_url, stop = serve_in_thread(fake, host=host, port=port)
    try:
        yield base_url
    finally:
        stop()


# --------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m veracity.testing.fake_n8n", description="Run a fake n8n."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5678)
    parser.add_argument("--version", default="1.123", help="n8n version to imitate (1.x, 2.x)")
    parser.add_argument("--api-key", default="fake-n8n-api-key")
    parser.add_argument("--email", default="owner@example.com")
    parser.add_argument("--password", default="fake-n8n-password")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added per request")
    parser.add_argument(
        "--migrating-for",
        type=float,
        default=0.0,
        metavar="S",
        help="for S seconds from launch, answer 200 'n8n is starting up. Please wait'",
    )
    parser.add_argument(
        "--starting-for",
        type=float,
        default=0.0,
        metavar="S",
        help="then for S seconds, answer 404 'Cannot <METHOD> <path>' (no route mounted yet)",
    )
    parser.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="PATH",
        help="register a production webhook with the default script (repeatable)",
    )
    args = parser.parse_args(argv)
    fake = FakeN8n(
        version=args.version,
        api_key=args.api_key,
        email=args.email,
        password=args.password,
        latency=args.latency,
        migrating_for=args.migrating_for,
        starting_for=args.starting_for,
    )
    for path in args.webhook:
        fake.add_webhook(path)
    print(
        f"fake n8n {fake.version} listening on http://{args.host}:{args.port}",
        flush=True,
    )
    uvicorn.run(
        create_app(fake),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=2,
    )
