"""One look at a running delegated execution: ask its engine, decide, stop it if wanted.

The reconciler takes a look at every running delegated execution each tick; an operator's
resolve and a cancel of a delegated run take one at once. Every decision is
:func:`veracity.core.reconcile.decide`'s; this module only gathers its observation (the
engine's answer by id, each call bounded by a timeout) and carries out a remote stop,
after which it looks again and decides from what the engine then says. It writes nothing:
the caller applies the resulting :class:`~veracity.models.ReconcileAction` with
``execution_reconcile_apply``, which re-checks the row (docs/external.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from veracity.adapters.base import Engine, Inspection
from veracity.core.reconcile import (
    DEFAULT_STOP_FLAG_AFTER,
    Action,
    Decision,
    EngineState,
    FlagKind,
    Observation,
    OperatorEnd,
    StopCause,
    WriteKind,
    decide,
    limit_breached,
)
from veracity.models import Execution, ReconcileAction

log = logging.getLogger("veracity.reconciler")

_OPERATOR_ENDS = frozenset(str(end) for end in OperatorEnd)
_FLAG_KINDS = frozenset(str(kind) for kind in FlagKind)
_UNDECIDED = Decision(Action.NOTHING, "the engine has not answered yet")


@dataclass
class Look:
    """What one look found and decided."""

    execution: Execution
    decision: Decision
    action: ReconcileAction | None = None
    """The write to apply, if any."""
    inspection: Inspection | None = None
    """The engine's last answer (after a stop, the answer to the second question)."""
    stop: str | None = None
    """How a remote stop request went (``ok``, ``failed: ...``, ``timeout``,
    ``error: ...``), when one was sent."""
    engine_errors: list[str] = field(default_factory=list)
    """The kinds of unusable engine answers met (metric labels)."""
    why_unknown: str | None = None
    """In words, why the engine could not confirm anything, when it could not."""


class Looker:
    """Takes looks at delegated executions with the engines configured here."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        limits: Mapping[str, float | None],
        *,
        engine_timeout: float = 10.0,
        trigger_grace: Mapping[str, float] | None = None,
        stop_flag_after: float = DEFAULT_STOP_FLAG_AFTER.total_seconds(),
    ) -> None:
        self.engines = engines
        self.limits = limits
        self.engine_timeout = engine_timeout
        self.trigger_grace = dict(trigger_grace or {})
        """Per engine, how long after its trigger an execution without an external id may
        still be waiting for the engine's answer (the engine's own call timeout): until
        then the missing id is not news."""
        self.stop_flag_after = stop_flag_after
        self._stop_flag_after = timedelta(seconds=stop_flag_after)
        self._graces: dict[str, timedelta] = {}
        self._limits: dict[str, timedelta | None] = {}

    def observe(self, e: Execution, now: datetime, *,
                engine: EngineState = EngineState.UNKNOWN,
                unknown_id: bool = False) -> Observation:
        """The observation of ``e``: before the engine is asked, or with its answer
        (``engine``, ``unknown_id``)."""
        request = e.end_request if isinstance(e.end_request, dict) else None
        action = request.get("action") if request else None
        return Observation(
            now=now,
            has_external_id=e.external_execution_id is not None,
            triggered_at=e.triggered_at,
            trigger_grace=self._grace(e.engine),
            max_duration=self._limit(e.ffqn),
            engine_configured=(e.engine or "") in self.engines,
            engine=engine,
            unknown_id=unknown_id,
            cancel_requested_at=e.cancel_requested_at,
            operator_end=OperatorEnd(action) if action in _OPERATOR_ENDS else None,
            operator_end_at=e.end_requested_at,
            stop_flag_after=self._stop_flag_after,
            flag=FlagKind(e.flag_kind) if e.flag_kind in _FLAG_KINDS else None,
        )

    # Each look needs these durations; made once per engine and workflow, not per look
    # (a tick takes ten thousand looks; bench/reconciler.py).

    def _grace(self, engine: str | None) -> timedelta:
        key = engine or ""
        grace = self._graces.get(key)
        if grace is None:
            grace = self._graces[key] = timedelta(seconds=self.trigger_grace.get(key, 0.0))
        return grace

    def _limit(self, ffqn: str) -> timedelta | None:
        if ffqn in self._limits:
            return self._limits[ffqn]
        seconds = self.limits.get(ffqn)
        limit = self._limits[ffqn] = timedelta(seconds=seconds) if seconds is not None else None
        return limit

    async def look(
        self, e: Execution, now: datetime, *,
        before_stop: Callable[[], Awaitable[None]] | None = None, by: str = "reconciler",
    ) -> Look:
        """Ask the engine about ``e`` (if it can be asked), decide, and stop the run if the
        decision says so, then ask again and decide from that. ``before_stop`` runs just
        before a stop request (the reconciler checks it still holds its lock there);
        ``by`` is who took the look (recorded with the write)."""
        engine = self.engines.get(e.engine or "")
        if e.external_execution_id is None or engine is None:
            obs = self.observe(e, now)
            result = Look(e, decide(obs))
            result.why_unknown = ("it has no external id: the engine cannot be asked"
                                  if e.external_execution_id is None
                                  else f"its engine {e.engine!r} is not configured here")
            result.action = self._write(e, obs, result.decision, result, by)
            return result
        result = Look(e, _UNDECIDED)
        state, unknown_id = await self._ask(engine, e.external_execution_id, result)
        obs = self.observe(e, now, engine=state, unknown_id=unknown_id)
        result.decision = decide(obs)
        if result.decision.action is Action.STOP_REMOTE:
            if before_stop is not None:
                await before_stop()
            result.stop = await self._stop(engine, e.external_execution_id, result)
            # whatever the stop answered, decide from what the engine now says
            state, unknown_id = await self._ask(engine, e.external_execution_id, result)
            obs = replace(obs, engine=state, unknown_id=unknown_id, stop_sent=True)
            result.decision = decide(obs)
            if result.stop != "ok" and obs.engine is not EngineState.FINISHED:
                result.why_unknown = f"the engine did not accept the stop ({result.stop})"
            elif obs.engine is EngineState.RUNNING:
                result.why_unknown = ("the engine accepted the stop but still runs the run "
                                      f"(status {obs_status(result)})")
        result.action = self._write(e, obs, result.decision, result, by)
        return result

    async def _ask(self, engine: Engine, external_id: str,
                   result: Look) -> tuple[EngineState, bool]:
        """The engine's answer about ``external_id``: its state, and whether its own API
        said the id is none of its runs."""
        try:
            inspection = await asyncio.wait_for(engine.inspect(external_id),
                                                self.engine_timeout)
        except TimeoutError:
            result.engine_errors.append("timeout")
            result.inspection = None
            result.why_unknown = f"the engine did not answer within {self.engine_timeout:g} s"
            return EngineState.UNKNOWN, False
        except Exception as exc:  # an adapter must not crash the caller, whatever it does
            result.engine_errors.append("adapter_error")
            log.warning("engine adapter raised: %s", exc, extra={"domain": "reconciler"})
            result.inspection = None
            result.why_unknown = f"the engine adapter failed: {exc}"
            return EngineState.UNKNOWN, False
        result.inspection = inspection
        if inspection.error:
            result.engine_errors.append(str(inspection.error))
            result.why_unknown = f"the engine's answer is unusable: {inspection.detail}"
        else:
            result.why_unknown = None
        return inspection.state, inspection.needs_operator

    async def _stop(self, engine: Engine, external_id: str, result: Look) -> str:
        try:
            outcome = await asyncio.wait_for(engine.stop(external_id), self.engine_timeout)
        except TimeoutError:
            result.engine_errors.append("stop_timeout")
            return "timeout"
        except Exception as exc:
            result.engine_errors.append("stop_error")
            return f"error: {exc}"
        if not outcome.ok:
            result.engine_errors.append("stop_failed")
            return f"failed: {outcome.reason}"
        return "ok"

    def _write(self, e: Execution, obs: Observation, decision: Decision, look: Look,
               by: str) -> ReconcileAction | None:
        data: dict[str, Any] = {"by": by, "engine": e.engine}
        if e.triggered_at is not None:
            data["limit_breached"] = obs.max_duration is not None and limit_breached(
                e.triggered_at, obs.max_duration, obs.now)
        if look.inspection is not None:
            data.update(engine_status=look.inspection.status,
                        engine_stopped_at=look.inspection.stopped_at)
        if look.stop is not None:
            data["stop"] = look.stop
        if decision.cause is not None:
            data["cause"] = str(decision.cause)
        if decision.action is Action.END:
            assert decision.to is not None
            error = None
            request = e.end_request if isinstance(e.end_request, dict) else {}
            if decision.cause in (StopCause.OPERATOR_FAIL, StopCause.OPERATOR_CANCEL):
                data.update(by=request.get("by"), requested_reason=request.get("reason"),
                            resolved=True, engine_confirmed=True)
                error = {"code": "operator", "message": request.get("reason"),
                         "by": request.get("by"), "engine_confirmed": True}
            elif decision.cause is StopCause.CANCEL:
                data["cancel_requested_at"] = (e.cancel_requested_at.isoformat()
                                               if e.cancel_requested_at else None)
            return ReconcileAction(e.id, e.external_execution_id, WriteKind.TERMINATE,
                                   decision.reason, data, to=decision.to, error=error)
        if decision.action is Action.FLAG:
            reason = decision.reason
            if decision.flag is FlagKind.UNKNOWN_ID and look.inspection is not None:
                what = "does not know" if look.inspection.not_found else "refuses"
                reason = (f"the engine {what} external id {e.external_execution_id} "
                          f"({look.inspection.detail}); left running, cleared if a later "
                          "look finds the run")
            return ReconcileAction(e.id, e.external_execution_id, WriteKind.FLAG,
                                   reason, data, flag=decision.flag)
        if decision.clear_flag:
            return ReconcileAction(e.id, e.external_execution_id, WriteKind.UNFLAG,
                                   "the engine reports the run: the flag no longer holds",
                                   data)
        return None


def obs_status(look: Look) -> str | None:
    return look.inspection.status if look.inspection is not None else None
