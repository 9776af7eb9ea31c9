"""External workflows: ``[[external_workflow]]`` entries, the engines they run on, and the
worker's side of starting a run without ever starting it twice (seed 000, DESIGN 4)."""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from veracity.config import Settings, parse_duration
from veracity.core.ffqn import InvalidFfqn, validate_ffqn
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.core.states import Status
from veracity.engines.base import CallbackInfo, Engine, EngineConfig, StartOutcome, parse_engines
from veracity.errors import ConfigError
from veracity.models import Claim, Execution, ReconcileAction
from veracity.store._ops import token_hash
from veracity.store.protocol import Store

log = logging.getLogger("veracity.worker")
KEYS = frozenset({"ffqn", "engine", "webhook", "max_duration"})


@dataclass(frozen=True, slots=True)
class ExternalWorkflow:
    ffqn: str
    engine: str
    webhook: str
    """A path under the engine's base_url, or a full URL."""
    max_duration: float | None
    """Seconds from Veracity's own trigger time; None: no limit."""


@dataclass(frozen=True, slots=True)
class ExternalConfig:
    public_url: str | None
    engines: dict[str, EngineConfig]
    workflows: dict[str, ExternalWorkflow]

    @property
    def limits(self) -> dict[str, float | None]:
        return {ffqn: wf.max_duration for ffqn, wf in self.workflows.items()}


def parse_external(settings: Settings, environ: Mapping[str, str] | None = None
                   ) -> ExternalConfig:
    """Validate engines and external workflows; errors name the entry at fault."""
    engines = parse_engines(settings.engines, environ)
    workflows: dict[str, ExternalWorkflow] = {}
    for i, entry in enumerate(settings.external_workflow):
        name = f"external_workflow[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{name}: expected a table")
        ffqn = entry.get("ffqn")
        if isinstance(ffqn, str):
            name = f"{name} ({ffqn})"
        unknown = set(entry) - KEYS
        if unknown:
            raise ConfigError(f"{name}: unknown keys {', '.join(sorted(unknown))}")
        if not isinstance(ffqn, str):
            raise ConfigError(f"{name}: ffqn is required (namespace:package/interface.fn)")
        try:
            validate_ffqn(ffqn)
        except InvalidFfqn as exc:
            raise ConfigError(f"{name}: {exc}") from None
        engine = entry.get("engine")
        if not isinstance(engine, str) or engine not in engines:
            known = ", ".join(sorted(engines)) or "none is configured"
            raise ConfigError(f"{name}: engine {engine!r} is not an [engines.<name>] entry "
                              f"(known: {known})")
        webhook = entry.get("webhook")
        if not isinstance(webhook, str) or not webhook.strip():
            raise ConfigError(f"{name}: webhook is required (a path under the engine's "
                              "base_url, or a full URL)")
        if not (webhook.startswith("/") or webhook.startswith(("http://", "https://"))):
            raise ConfigError(f"{name}: webhook {webhook!r} must start with / or http(s)://")
        limit: float | None = None
        if entry.get("max_duration") is not None:
            try:
                limit = parse_duration(entry["max_duration"])
            except ValueError as exc:
                raise ConfigError(f"{name}: max_duration: {exc}") from None
            if limit <= 0:
                raise ConfigError(f"{name}: max_duration must be positive")
        if ffqn in workflows:
            raise ConfigError(f"{name}: {ffqn} is configured twice")
        workflows[ffqn] = ExternalWorkflow(ffqn, engine, webhook, limit)
    public_url = settings.public_url
    if workflows and not public_url:
        public_url = f"http://{settings.host}:{settings.port}"
    if public_url is not None and not public_url.startswith(("http://", "https://")):
        raise ConfigError(f"public_url {public_url!r} must be an http(s) URL")
    return ExternalConfig(public_url.rstrip("/") if public_url else None, engines, workflows)


def build_engines(config: ExternalConfig) -> dict[str, Engine]:
    from veracity.engines.n8n import N8nEngine

    return {name: N8nEngine(cfg) for name, cfg in config.engines.items()}


async def close_engines(engines: Mapping[str, Engine]) -> None:
    for engine in engines.values():
        try:
            await engine.aclose()
        except Exception as exc:  # closing is best effort
            log.warning("closing engine %s: %s", engine.name, exc)


async def trigger(store: Store, engine: Engine, workflow: ExternalWorkflow,
                  execution: Execution, claim: Claim, public_url: str) -> str:
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
        return await _ambiguous(store, execution.id, f"the engine adapter raised: {exc}")
    if started.outcome == StartOutcome.STARTED and started.external_id:
        recorded = await store.execution_record_external_id(execution.id,
                                                            started.external_id)
        if not recorded.changed:
            log.warning("the engine's id arrived after the execution was resolved",
                        extra={"domain": "worker", "execution_id": str(execution.id),
                               "external_execution_id": started.external_id})
        return f"started {started.external_id}"
    if started.outcome == StartOutcome.REFUSED:
        await store.execution_end_external(
            execution.id, to=Status.FAILED, expected_external_id=None,
            error={"code": "engine_refused", "message": started.message,
                   "status_code": started.status_code},
            event={"by": "worker", "reason": "the engine refused the trigger",
                   "engine": workflow.engine, "message": started.message})
        return f"refused: {started.message}"
    if started.outcome == StartOutcome.UNAVAILABLE:
        # certainly nothing started (refused connection, 429, n8n starting up): infrastructure
        await store.execution_end_external(
            execution.id, to=Status.FAILED_TRANSIENT, expected_external_id=None,
            error={"code": "engine_unavailable", "message": started.message},
            event={"by": "worker", "reason": "the engine was unavailable; nothing started",
                   "engine": workflow.engine, "message": started.message})
        return f"unavailable: {started.message}"
    return await _ambiguous(store, execution.id, started.message or str(started.outcome))


async def _ambiguous(store: Store, execution_id: uuid.UUID, why: str) -> str:
    reason = (f"the trigger's outcome is unknown ({why}); the run may exist in the engine. "
              "Not triggered again: attach its id or end the run")
    await store.execution_reconcile_apply([ReconcileAction(
        execution_id, None, WriteKind.FLAG, reason, flag=FlagKind.TRIGGER_UNKNOWN)])
    log.warning("trigger outcome unknown", extra={"domain": "worker",
                                                  "execution_id": str(execution_id),
                                                  "reason": why})
    return f"ambiguous: {why}"


def describe_external(config: ExternalConfig) -> dict[str, Any]:
    return {"engines": sorted(config.engines), "workflows": sorted(config.workflows)}
