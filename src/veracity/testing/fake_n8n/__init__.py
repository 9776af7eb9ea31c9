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

The package: :mod:`.scripts` (what runs do), :mod:`.truth` (ground truth and records),
:mod:`.engine` (:class:`FakeN8n`), :mod:`.web` (the ASGI app: n8n's routes and ``/_fake``),
:mod:`.serve` (serving in a thread), :mod:`.cli` (the command line, run by ``__main__``) and
:mod:`.dates`; the names below are re-exported from them.
"""

from __future__ import annotations

from veracity.testing.fake_n8n.cli import main
from veracity.testing.fake_n8n.dates import iso
from veracity.testing.fake_n8n.engine import FakeN8n
from veracity.testing.fake_n8n.scripts import (
    PARK_THRESHOLD_SECONDS,
    WAIT_INDEFINITELY,
    Script,
    Wait,
    Work,
)
from veracity.testing.fake_n8n.serve import running, serve_asgi_in_thread, serve_in_thread
from veracity.testing.fake_n8n.truth import CallbackAttempt, RunTruth, StopRecord, Transition
from veracity.testing.fake_n8n.web import create_app

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
    "iso",
    "main",
    "running",
    "serve_asgi_in_thread",
    "serve_in_thread",
]
