"""The fake engine, :class:`FakeN8n`: webhooks and scripts, each run's state machine on the
injectable clock, stops, kills, restarts and start-up windows, login sessions, what the API
shows, and the ground truth with its truthfulness check. No HTTP here: :mod:`.web` serves it.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from veracity.testing.fake_n8n.dates import _require_aware, iso, iso_full
from veracity.testing.fake_n8n.scripts import (
    _CALLBACK_MODES,
    _OUTCOMES,
    WAIT_INDEFINITELY,
    CallbackMode,
    Outcome,
    Script,
    Wait,
)
from veracity.testing.fake_n8n.truth import CallbackAttempt, RunTruth, StopRecord, Transition

if TYPE_CHECKING:
    from veracity.testing.fake_n8n.web import _Runtime


STATUSES = ("new", "running", "waiting", "success", "error", "canceled", "crashed", "unknown")
STOPPABLE = frozenset({"new", "unknown", "waiting", "running"})
IN_MEMORY = frozenset({"new", "running", "waiting"})


def _utc_now() -> datetime:
    return datetime.now(UTC)


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
