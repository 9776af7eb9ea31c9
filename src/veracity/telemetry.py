"""What every Veracity process counts for an operator to alert on: submissions, executions
ended by workflow and status, how long executions wait to start and run to their end, steps
and step retries, claim batch sizes, late reports kept and flags raised, and the API's
requests by route and status (docs/operations.md, Metrics).

Counters are per process, as Prometheus expects: the process that wrote a transition counts
it (a worker its completions, a server the cancels, callbacks and reconciler ends it
writes), and a sum over the processes is the whole. A ``veracity server`` serves them on
``/metrics``; a ``veracity worker`` on ``worker.metrics_port`` when it is set. The gauge of
executions by status is read from the database at each scrape of a server."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from veracity.core.states import Status
from veracity.models import Execution, Exit

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                   900, 3600, 6 * 3600, 86400)
"""Seconds, for the times an execution waits and runs: from milliseconds to a day."""

HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                60)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
UNFINISHED = tuple(status for status in Status if not status.is_terminal)
"""The statuses ``veracity_executions`` counts (the store counts these alone)."""

STEP_OUTCOMES = ("completed", "failed")
LATE_SOURCES = ("worker", "callback")
"""Who sent a report that came too late and was kept in the history (docs/states.md): a
worker's exit after its lease was lost or the execution ended, or an engine's callback for
an execution already ended otherwise."""
FLAGGED_BY = ("reconciler", "worker", "operator")


class _Children:
    """A labelled metric's children, each looked up once per label values: ``labels()``
    takes a lock and builds its key on every call."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class Telemetry:
    """The metrics of one process, registered in :attr:`registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.submissions = Counter(
            "veracity_submissions", "Submissions accepted by this process, by workflow and "
            "outcome (created: a new execution; existing: an idempotency key seen before)",
            ["ffqn", "outcome"], registry=r)
        self.ended = Counter(
            "veracity_executions_ended", "Executions this process moved to a terminal "
            "status, by workflow and status", ["ffqn", "status"], registry=r)
        self.queued = Histogram(
            "veracity_execution_queue_seconds", "From submission (or the scheduled time, "
            "if later) to the first start, by the database's clock", registry=r,
            buckets=LATENCY_BUCKETS)
        self.ran = Histogram(
            "veracity_execution_run_seconds", "From the first start to the terminal status, "
            "by the database's clock (sleeps and waits included)", registry=r,
            buckets=LATENCY_BUCKETS)
        self.steps = Counter(
            "veracity_steps", "Steps run to their end, by workflow and outcome (completed; "
            "failed once its retries were spent)", ["ffqn", "outcome"], registry=r)
        self.step_retries = Counter(
            "veracity_step_retries", "Step attempts that raised and were tried again, by "
            "workflow", ["ffqn"], registry=r)
        self.claim_batch = Histogram(
            "veracity_claim_batch_size", "Executions taken by each claim that took any",
            registry=r, buckets=BATCH_BUCKETS)
        self.handoffs = Counter(
            "veracity_handoffs", "Executions this worker started from a hand-off (a "
            "submission written claimed by it, its offer), not from a claim", registry=r)
        self.submit_writes = Histogram(
            "veracity_submission_write_size", "Single submissions each write of a server "
            "carried: 1 when alone, more when they arrived together and shared a "
            "transaction (group commit)", registry=r, buckets=BATCH_BUCKETS)
        self.late_reports = Counter(
            "veracity_late_reports", "Reports kept in the history because they came after "
            "the execution ended or changed hands, by source", ["source"], registry=r)
        self.flags = Counter(
            "veracity_flags_raised", "Executions flagged for an operator, by who raised the "
            "flag and its kind", ["by", "kind"], registry=r)
        self.http_requests = Counter(
            "veracity_http_requests", "HTTP requests answered, by method, route template "
            "and status", ["method", "route", "status"], registry=r)
        self.http_seconds = Histogram(
            "veracity_http_request_duration_seconds", "Time to answer an HTTP request, by "
            "method and route template", ["method", "route"], registry=r,
            buckets=HTTP_BUCKETS)
        self.executions = Gauge(
            "veracity_executions", "Unfinished executions in the database by status "
            "(pending, running, blocked, paused), read at each scrape of a server",
            ["status"], registry=r)
        # only the unfinished statuses: the scrape counts those alone (an ended status's
        # series would say 0 whatever the table holds; docs/operations.md)
        for status in UNFINISHED:
            self.executions.labels(str(status))
        for source in LATE_SOURCES:
            self.late_reports.labels(source)
        self._ended: dict[tuple[str, Status], Any] = {}
        self._submissions = _Children(self.submissions)
        self._steps = _Children(self.steps)
        self._step_retries = _Children(self.step_retries)

    # -- what the code calls where things happen -------------------------------------

    def submitted(self, ffqn: str, *, created: bool, count: int = 1) -> None:
        self._submissions(ffqn, "created" if created else "existing").inc(count)

    def started(self, execution: Execution) -> None:
        """A claim: the first one of an execution observes its time in the queue."""
        first = execution.started_at is not None and execution.started_at == execution.updated_at
        if first:
            due = max(execution.created_at, execution.scheduled_at)
            self.queued.observe(max(0.0, (execution.updated_at - due).total_seconds()))

    def end(self, execution: Execution | Exit | None) -> None:
        """A transition this process wrote (the row, or a batched exit's answer); counted if
        it ended the execution."""
        if execution is None or not execution.status.is_terminal:
            return
        self.end_at(execution.ffqn, execution.status, execution.started_at,
                    execution.updated_at)

    def end_at(self, ffqn: str, status: Status, started_at: datetime | None,
               at: datetime) -> None:
        """An end this process wrote, known by its parts."""
        key = (ffqn, status)
        child = self._ended.get(key)
        if child is None:  # labels() takes a lock and builds a key: once per pair
            child = self._ended[key] = self.ended.labels(ffqn, str(status))
        child.inc()
        if started_at is not None:
            self.ran.observe(max(0.0, (at - started_at).total_seconds()))

    def step(self, ffqn: str, outcome: str) -> None:
        self._steps(ffqn, outcome).inc()

    def step_retry(self, ffqn: str) -> None:
        self._step_retries(ffqn).inc()

    def claimed(self, count: int) -> None:
        if count:
            self.claim_batch.observe(count)

    def handed_off(self) -> None:
        self.handoffs.inc()

    def submissions_written(self, count: int) -> None:
        self.submit_writes.observe(count)

    def late(self, source: str) -> None:
        self.late_reports.labels(source).inc()

    def flagged(self, by: str, kind: str) -> None:
        self.flags.labels(by, kind).inc()

    def set_counts(self, counts: dict[str, int]) -> None:
        """The gauge of unfinished executions by status, from the database's counts."""
        for status in UNFINISHED:
            self.executions.labels(str(status)).set(counts.get(str(status), 0))


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class HttpMetrics:
    """ASGI middleware counting each HTTP request by method, route template (never the
    raw path: ids would make a series each) and status, with its time to answer. A path no
    route matched is counted as ``route="unmatched"``."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry,
                 routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.telemetry = telemetry
        self.routes = routes
        """The application's routes (the router's own list: routes added later count)."""
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def template(self, scope: Scope) -> str:
        """The route template a request was served by. Found by matching, since a
        middleware inside may have served the request with a copy of its scope."""
        route = scope.get("route")
        if route is not None and getattr(route, "path", None):
            return str(route.path)
        from starlette.routing import Match  # the server's, loaded by it already

        partial = None
        for candidate in self.routes:
            match, _ = candidate.matches(scope)
            if match is Match.FULL:
                return str(getattr(candidate, "path", "unmatched"))
            if match is Match.PARTIAL and partial is None:  # the path, another method
                partial = str(getattr(candidate, "path", "unmatched"))
        return partial or "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response started is answered 500

        async def sending(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            key = (str(scope.get("method", "GET")), self.template(scope), status)
            children = self._children.get(key)
            if children is None:  # labels() takes a lock and builds a key: once per series
                method, template, _ = key
                children = self._children[key] = (
                    self.telemetry.http_requests.labels(method, template, str(status)),
                    self.telemetry.http_seconds.labels(method, template))
            children[0].inc()
            children[1].observe(time.perf_counter() - started)
