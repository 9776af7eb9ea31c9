"""One look at a running delegated execution (veracity.adapters.looks), in process: what the
look observes from the execution record, what it asks the engine and when, how a remote
stop goes, and the write it leads to (docs/external.md, "The reconciler"). The engine here
is a scripted stand-in; the end-to-end behaviour over the fake n8n is in tests/reconciler/.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from veracity.adapters.base import (
    CallbackInfo,
    EngineErrorKind,
    Inspection,
    StartResult,
    StopResult,
)
from veracity.adapters.looks import Look, Looker
from veracity.config import Settings
from veracity.core.reconcile import Action, EngineState, FlagKind, OperatorEnd, StopCause, WriteKind
from veracity.core.states import Status
from veracity.models import Execution

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
FFQN = "shop:orders/fulfil.run"
BREACHED = 55 * 60.0
"""A limit the execution (triggered an hour ago) breached five minutes ago."""
RUN = "run-7"
RUNNING = Inspection(EngineState.RUNNING, status="running")
FINISHED = Inspection(EngineState.FINISHED, status="canceled", stopped_at="2030-01-01T12:00:00Z")


@dataclass
class ScriptedEngine:
    """Answers ``inspect`` and ``stop`` from scripts (the last answer repeats); an exception
    in a script is raised, ``"hang"`` never answers. Records the calls, in order."""

    inspections: list[Inspection | BaseException | str] = field(
        default_factory=lambda: [RUNNING])
    stops: list[StopResult | BaseException | str] = field(
        default_factory=lambda: [StopResult(ok=True)])
    calls: list[str] = field(default_factory=list)
    name: str = "n8n"

    async def start(self, execution_id: str, params: Any, callback: CallbackInfo, *,
                    target: str) -> StartResult:
        raise AssertionError("a look never starts a run")

    async def inspect(self, external_id: str) -> Inspection:
        self.calls.append(f"inspect {external_id}")
        answer = self.inspections.pop(0) if len(self.inspections) > 1 else self.inspections[0]
        inspection = await self._answer(answer)
        assert isinstance(inspection, Inspection)
        return inspection

    async def stop(self, external_id: str) -> StopResult:
        self.calls.append(f"stop {external_id}")
        answer = self.stops.pop(0) if len(self.stops) > 1 else self.stops[0]
        stopped = await self._answer(answer)
        assert isinstance(stopped, StopResult)
        return stopped

    @staticmethod
    async def _answer(answer: object) -> object:
        if answer == "hang":
            await asyncio.sleep(3600)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def aclose(self) -> None:
        pass


def execution(**fields: Any) -> Execution:
    """A running execution delegated to ``n8n`` as run ``RUN``, triggered an hour ago."""
    values: dict[str, Any] = dict(
        id=uuid.UUID(int=7), ffqn=FFQN, params=[], status=Status.RUNNING, result=None,
        error=None, attempt=1, deployment_id="d1", parent_id=None, idempotency_key=None,
        scheduled_at=NOW, created_at=NOW, updated_at=NOW, lease_owner=None, lease_epoch=1,
        lease_expires_at=None, engine="n8n", external_execution_id=RUN,
        triggered_at=NOW - timedelta(hours=1))
    values.update(fields)
    return Execution(**values)


def looker(engine: ScriptedEngine | None = None, *, limit: float | None = None,
           **options: Any) -> Looker:
    engines = {"n8n": engine} if engine is not None else {}
    return Looker(engines, {FFQN: limit}, **options)


async def look(engine: ScriptedEngine | None, e: Execution, **options: Any) -> Look:
    limit = options.pop("limit", None)
    return await looker(engine, limit=limit, **options).look(e, NOW)


# -- what a look observes --------------------------------------------------------------------


def test_the_observation_comes_from_the_execution_record() -> None:
    asked = NOW - timedelta(minutes=3)
    e = execution(cancel_requested_at=asked, flag_kind="unknown_id",
                  end_request={"action": "fail", "reason": "r", "by": "ada"},
                  end_requested_at=asked)
    o = looker(ScriptedEngine(), limit=60.0, trigger_grace={"n8n": 6.0},
               stop_flag_after=90.0).observe(e, NOW)
    assert (o.now, o.has_external_id, o.triggered_at) == (NOW, True, e.triggered_at)
    assert o.trigger_grace == timedelta(seconds=6)
    assert o.max_duration == timedelta(seconds=60)
    assert o.engine_configured is True
    assert (o.cancel_requested_at, o.operator_end, o.operator_end_at) == (
        asked, OperatorEnd.FAIL, asked)
    assert o.stop_flag_after == timedelta(seconds=90)
    assert o.flag is FlagKind.UNKNOWN_ID


def test_what_the_record_does_not_say_is_not_observed() -> None:
    e = execution(external_execution_id=None, engine="other", flag_kind="not-a-flag",
                  end_request={"action": "attach"})
    o = looker(ScriptedEngine()).observe(e, NOW)
    assert o.has_external_id is False
    assert o.engine_configured is False
    assert o.max_duration is None  # no limit configured for the workflow
    assert o.operator_end is None and o.flag is None
    assert o.trigger_grace == timedelta(0)
    assert looker(ScriptedEngine()).observe(execution(end_request="fail"), NOW).operator_end \
        is None


async def test_without_a_grace_a_missing_id_is_news_from_the_trigger_on_not_before() -> None:
    """An engine without a configured grace: an execution triggered after the look's time
    was read (the reconciler reads it once per tick) is not flagged yet; one triggered at
    that time is."""
    engine = ScriptedEngine()
    just_sent = await look(engine, execution(external_execution_id=None,
                                             triggered_at=NOW + timedelta(milliseconds=500)))
    assert just_sent.action is None
    sent = await look(engine, execution(external_execution_id=None, triggered_at=NOW))
    assert sent.action is not None and sent.action.flag is FlagKind.NO_EXTERNAL_ID
    assert engine.calls == []


# -- what cannot be asked ----------------------------------------------------------------------


async def test_no_external_id_is_flagged_without_asking_the_engine() -> None:
    engine = ScriptedEngine()
    result = await look(engine, execution(external_execution_id=None))
    assert engine.calls == []
    assert result.why_unknown == "it has no external id: the engine cannot be asked"
    assert result.action is not None
    assert (result.action.kind, result.action.flag) == (WriteKind.FLAG, FlagKind.NO_EXTERNAL_ID)
    assert result.action.data == {"by": "reconciler", "engine": "n8n", "limit_breached": False}


async def test_an_engine_not_configured_here_is_flagged_without_asking() -> None:
    result = await look(None, execution())
    assert result.why_unknown == "its engine 'n8n' is not configured here"
    assert result.action is not None and result.action.flag is FlagKind.ENGINE_UNCONFIGURED
    assert result.inspection is None and result.engine_errors == []


# -- asking the engine ---------------------------------------------------------------------


async def test_a_run_within_its_limit_is_left_alone() -> None:
    engine = ScriptedEngine()
    result = await look(engine, execution(), limit=7200.0)
    assert engine.calls == [f"inspect {RUN}"]
    assert (result.decision.action, result.action, result.stop) == (Action.NOTHING, None, None)
    assert result.inspection == RUNNING and result.why_unknown is None


async def test_a_finished_run_is_ended_with_what_the_engine_said() -> None:
    result = await look(ScriptedEngine([FINISHED]), execution(), limit=7200.0)
    assert result.action is not None
    assert (result.action.kind, result.action.to) == (WriteKind.TERMINATE,
                                                      Status.FAILED_TRANSIENT)
    assert result.action.data == {"by": "reconciler", "engine": "n8n", "limit_breached": False,
                                  "engine_status": "canceled",
                                  "engine_stopped_at": "2030-01-01T12:00:00Z"}
    assert result.action.error is None


async def test_an_engine_that_does_not_answer_in_time() -> None:
    result = await look(ScriptedEngine(["hang"]), execution(), engine_timeout=0.05)
    assert result.engine_errors == ["timeout"]
    assert result.why_unknown == "the engine did not answer within 0.05 s"
    assert result.inspection is None and result.action is None
    assert result.decision.action is Action.NOTHING


async def test_an_adapter_that_raises_is_an_unknown_answer(
    caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="veracity.reconciler"):
        result = await look(ScriptedEngine([RuntimeError("boom")]), execution())
    assert result.engine_errors == ["adapter_error"]
    assert result.why_unknown == "the engine adapter failed: boom"
    assert result.inspection is None and result.action is None
    assert "engine adapter raised: boom" in caplog.text


@pytest.mark.parametrize(("kind", "what"), [(EngineErrorKind.NOT_FOUND, "does not know"),
                                            (EngineErrorKind.BAD_REQUEST, "refuses")])
async def test_an_id_the_engine_denies_is_flagged_in_its_words(
    kind: EngineErrorKind, what: str
) -> None:
    denied = Inspection.unknown(kind, "no such run")
    result = await look(ScriptedEngine([denied]), execution())
    assert result.engine_errors == [str(kind)]
    assert result.why_unknown == "the engine's answer is unusable: no such run"
    assert result.action is not None and result.action.flag is FlagKind.UNKNOWN_ID
    assert result.action.reason == (
        f"the engine {what} external id {RUN} (no such run); left running, cleared if a "
        "later look finds the run")


async def test_an_engine_not_ready_is_asked_again_and_never_flagged() -> None:
    result = await look(ScriptedEngine([Inspection.unknown(EngineErrorKind.NOT_READY, "")]),
                        execution())
    assert result.engine_errors == ["not_ready"] and result.action is None


async def test_a_flag_the_engine_disproves_is_cleared() -> None:
    result = await look(ScriptedEngine(), execution(flag_kind="unknown_id"))
    assert result.action is not None
    assert result.action.kind is WriteKind.UNFLAG
    assert result.action.reason == "the engine reports the run: the flag no longer holds"
    assert result.action.data["engine_status"] == "running"


# -- stopping a run ---------------------------------------------------------------------------


async def test_a_breached_run_is_stopped_then_ended_once_the_engine_confirms() -> None:
    engine = ScriptedEngine([RUNNING, FINISHED])
    order: list[str] = []

    async def before_stop() -> None:
        order.append(f"before stop, after {len(engine.calls)} call(s)")

    result = await looker(engine, limit=BREACHED).look(execution(), NOW, before_stop=before_stop,
                                                   by="ada")
    assert engine.calls == [f"inspect {RUN}", f"stop {RUN}", f"inspect {RUN}"]
    assert order == ["before stop, after 1 call(s)"]
    assert result.stop == "ok" and result.why_unknown is None
    assert result.inspection == FINISHED
    assert result.action is not None
    assert (result.action.kind, result.action.to) == (WriteKind.TERMINATE,
                                                      Status.FAILED_TRANSIENT)
    assert result.action.data == {
        "by": "ada", "engine": "n8n", "limit_breached": True, "engine_status": "canceled",
        "engine_stopped_at": "2030-01-01T12:00:00Z", "stop": "ok", "cause": "limit"}


async def test_a_failed_check_before_the_stop_sends_no_stop() -> None:
    engine = ScriptedEngine()

    async def lost() -> None:
        raise LookupError("lock lost")

    with pytest.raises(LookupError):
        await looker(engine, limit=BREACHED).look(execution(), NOW, before_stop=lost)
    assert engine.calls == [f"inspect {RUN}"]


async def test_a_stop_accepted_while_the_run_goes_on() -> None:
    result = await look(ScriptedEngine([RUNNING]), execution(), limit=BREACHED)
    assert result.stop == "ok" and result.action is None
    assert result.why_unknown == ("the engine accepted the stop but still runs the run "
                                  "(status running)")
    assert result.decision.cause is StopCause.LIMIT


@pytest.mark.parametrize(("stop", "said", "errors"), [
    (StopResult(ok=False, reason="409 already stopping"), "failed: 409 already stopping",
     ["stop_failed"]),
    ("hang", "timeout", ["stop_timeout"]),
    (RuntimeError("reset"), "error: reset", ["stop_error"]),
])
async def test_a_stop_the_engine_did_not_accept(
    stop: StopResult | BaseException | str, said: str, errors: list[str]
) -> None:
    engine = ScriptedEngine([RUNNING], [stop])
    result = await look(engine, execution(), limit=BREACHED, engine_timeout=0.05)
    assert engine.calls == [f"inspect {RUN}", f"stop {RUN}", f"inspect {RUN}"]
    assert result.stop == said and result.engine_errors == errors
    assert result.why_unknown == f"the engine did not accept the stop ({said})"
    assert result.action is None
    # the engine finished the run anyway: it ends, and nothing is left unknown
    ended = await look(ScriptedEngine([RUNNING, FINISHED], [stop]), execution(), limit=BREACHED,
                       engine_timeout=0.05)
    assert ended.why_unknown is None
    assert ended.action is not None and ended.action.kind is WriteKind.TERMINATE


async def test_an_operator_end_records_who_asked_and_why() -> None:
    e = execution(end_request={"action": "cancel", "reason": "customer withdrew", "by": "ada"},
                  end_requested_at=NOW)
    result = await look(ScriptedEngine([RUNNING, FINISHED]), e)
    assert result.action is not None and result.action.to is Status.CANCELLED
    assert result.action.data["by"] == "ada"
    assert result.action.data["requested_reason"] == "customer withdrew"
    assert result.action.data["resolved"] is True
    assert result.action.data["engine_confirmed"] is True
    assert result.action.data["cause"] == "operator_cancel"
    assert result.action.error == {"code": "operator", "message": "customer withdrew",
                                   "by": "ada", "engine_confirmed": True}


async def test_a_cancel_records_when_it_was_asked() -> None:
    asked = NOW - timedelta(seconds=30)
    result = await look(ScriptedEngine([RUNNING, FINISHED]),
                        execution(cancel_requested_at=asked))
    assert result.action is not None and result.action.to is Status.CANCELLED
    assert result.action.data["cancel_requested_at"] == asked.isoformat()
    assert result.action.data["cause"] == "cancel"
    assert result.action.error is None


async def test_an_execution_never_triggered_records_no_limit_verdict() -> None:
    result = await look(ScriptedEngine([FINISHED]), execution(triggered_at=None), limit=BREACHED)
    assert result.action is not None and "limit_breached" not in result.action.data


async def test_a_looks_options_are_named() -> None:
    """``before_stop`` and ``by`` are keyword-only, as are a looker's options after its
    engines and limits: a bare callable, name or number in a call could not say which it
    is."""
    with pytest.raises(TypeError):
        Looker({}, {}, 5.0)  # type: ignore[call-arg]
    assert Looker({}, {}, engine_timeout=5.0).engine_timeout == 5.0
    with pytest.raises(TypeError):
        await looker(ScriptedEngine()).look(execution(), NOW, None, "ada")  # type: ignore[call-arg]
    result = await looker(ScriptedEngine([FINISHED])).look(e=execution(), now=NOW, by="ada")
    assert result.action is not None and result.action.data["by"] == "ada"


def test_a_looker_without_options_waits_as_long_as_the_configured_default() -> None:
    """The engine timeout a look uses when none is given (an operator's resolve without a
    configured looker, the Python API) is ``reconciler.engine_timeout``'s default, 10 s
    (docs/external.md), and so is the trigger grace of an engine none was given for (0)."""
    default = Looker({}, {})
    assert default.engine_timeout == Settings().reconciler.engine_timeout == 10.0
    assert default.stop_flag_after == Settings().reconciler.stop_flag_after
    assert default.trigger_grace == {}
