"""The worker's side of starting a delegated run: never twice (docs/external.md,
"Starting a run, never twice")."""

from __future__ import annotations

import logging
import secrets
import uuid
from typing import TYPE_CHECKING

from veracity.adapters.base import CallbackInfo, Engine, StartOutcome
from veracity.adapters.config import ExternalWorkflow
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.core.states import Status
from veracity.models import Claim, Execution, ReconcileAction
from veracity.store import token_hash
from veracity.store.protocol import WorkerStore

if TYPE_CHECKING:
    from veracity.telemetry import Telemetry

log = logging.getLogger("veracity.worker")


async def trigger(store: WorkerStore, engine: Engine, workflow: ExternalWorkflow,
                  execution: Execution, claim: Claim, public_url: str, *,
                  telemetry: Telemetry | None = None) -> str:
    """Start the engine's run of a claimed execution, never twice.

    1. Record that the trigger is being sent: still running, engine set, no external id, no
       lease (from here a crash leaves it without an id: the reconciler flags it, nobody
       triggers it again).
    2. Call the engine.
    3. Record the engine's id; or, on a clear refusal, fail the execution with the engine's
       message; or, on an ambiguous answer, leave it as it is and flag it at once.
    Returns what happened, for logs and tests.
    """
    token = secrets.token_urlsafe(32)
    delegated = await store.execution_delegate_if_owned(claim, workflow.engine,
                                                        token_hash(token))
    if not delegated.applied:
        return "lease lost before the trigger"
    if delegated.execution is not None and delegated.execution.engine is None:
        # a cancel or pause requested since the claim was carried out instead
        return f"not triggered: {delegated.execution.status} before the trigger"
    base = f"{public_url}/v1/executions/{execution.id}"
    callback = CallbackInfo(complete_url=f"{base}/complete", fail_url=f"{base}/fail",
                            token=token)
    try:
        started = await engine.start(str(execution.id), execution.params, callback,
                                     target=workflow.webhook)
    except Exception as exc:  # an adapter that raises is an ambiguous answer
        return await _ambiguous(store, execution.id, f"the engine adapter raised: {exc}",
                                telemetry)
    if started.outcome == StartOutcome.STARTED and started.external_id:
        recorded = await store.execution_record_external_id(execution.id,
                                                            started.external_id)
        if not recorded.changed:
            log.warning("the engine's id arrived after the execution was resolved",
                        extra={"domain": "worker", "execution_id": str(execution.id),
                               "external_execution_id": started.external_id})
        return f"started {started.external_id}"
    if started.outcome == StartOutcome.REFUSED:
        ended = await store.execution_end_external(
            execution.id, to=Status.FAILED, expected_external_id=None,
            error={"code": "engine_refused", "message": started.message,
                   "status_code": started.status_code},
            event={"by": "worker", "reason": "the engine refused the trigger",
                   "engine": workflow.engine, "message": started.message})
        if telemetry is not None and ended.changed:
            telemetry.end(ended.execution)
        return f"refused: {started.message}"
    if started.outcome == StartOutcome.UNAVAILABLE:
        # certainly nothing started (refused connection, 429, n8n starting up): infrastructure
        ended = await store.execution_end_external(
            execution.id, to=Status.FAILED_TRANSIENT, expected_external_id=None,
            error={"code": "engine_unavailable", "message": started.message},
            event={"by": "worker", "reason": "the engine was unavailable; nothing started",
                   "engine": workflow.engine, "message": started.message})
        if telemetry is not None and ended.changed:
            telemetry.end(ended.execution)
        return f"unavailable: {started.message}"
    return await _ambiguous(store, execution.id, started.message or str(started.outcome),
                            telemetry)


async def _ambiguous(store: WorkerStore, execution_id: uuid.UUID, why: str,
                     telemetry: Telemetry | None) -> str:
    reason = (f"the trigger's outcome is unknown ({why}); the run may exist in the engine. "
              "Not triggered again: attach its id or end the run")
    applied = await store.execution_reconcile_apply([ReconcileAction(
        execution_id, None, WriteKind.FLAG, reason, flag=FlagKind.TRIGGER_UNKNOWN)])
    if applied and telemetry is not None:
        telemetry.flagged("worker", str(FlagKind.TRIGGER_UNKNOWN))
    # logged as the reconciler logs a flag it raises: an action, with its kind
    log.warning("trigger outcome unknown", extra={"domain": "worker", "action": "flag",
                                                  "flag_kind": str(FlagKind.TRIGGER_UNKNOWN),
                                                  "execution_id": str(execution_id),
                                                  "reason": why})
    return f"ambiguous: {why}"
