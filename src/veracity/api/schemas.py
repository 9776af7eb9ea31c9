"""Request and response bodies of the HTTP API."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import to_json

from veracity.control import AdoptOutcome, CronView, DeploymentView, SubmitItem, WorkerView
from veracity.core.ffqn import FFQN_PATTERN, FFQN_PREFIX_PATTERN, MAX_FFQN_LENGTH
from veracity.core.states import Status
from veracity.errors import InvalidInput, VeracityError
from veracity.models import Execution, HistoryEvent

LIST_VALUE_BYTES = 1024
"""A list item leaves out params, result and error larger than this (see ``elided``)."""


TIME_FORMAT = "an RFC 3339 time with its offset, e.g. 2030-01-01T00:00:00Z"
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(?:\.\d+)?(?:[Zz]|[+-]\d\d:\d\d)\Z")


def _time_text(value: Any) -> Any:
    """Every time the API takes (in a body or a query) has one format: RFC 3339, with its
    offset. A bare number (or a string of digits) is refused rather than taken for a Unix
    timestamp, and a time without an offset rather than guessed."""
    if value is not None and not (isinstance(value, str) and _RFC3339.match(value)):
        raise ValueError(f"must be {TIME_FORMAT}")
    return value


Time = Annotated[
    AwareDatetime, BeforeValidator(_time_text),
    WithJsonSchema({"type": "string", "format": "date-time", "description": TIME_FORMAT})]
"""A time the API takes: RFC 3339 with its offset (``format: date-time``)."""

def _bool_text(value: Any) -> Any:
    """A boolean in a query is ``true`` or ``false``, as the document says; not ``1``,
    ``yes`` or ``on``."""
    if value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value == "true"


QueryBool = Annotated[bool, BeforeValidator(_bool_text),
                      WithJsonSchema({"type": "boolean"})]
"""A boolean query parameter: ``true`` or ``false``."""

Uuid = Annotated[str, WithJsonSchema({"type": "string", "format": "uuid"})]
"""An id the API answers with: a UUID."""

NO_NUL = r"^[^\x00]*$"


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ffqn: str = Field(
        description="Workflow name: namespace:package/interface.function (422 invalid_ffqn "
        "otherwise; unknown_workflow for a name the server's app does not register)",
        json_schema_extra={"pattern": FFQN_PATTERN, "maxLength": MAX_FFQN_LENGTH})
    # any JSON here: the service refuses what is not an array as invalid_params, as it
    # refuses params that do not fit the workflow's signature
    params: Any = Field(default_factory=list, description="Positional parameters (not an "
                        "array: 422 invalid_params)",
                        json_schema_extra={"type": "array", "items": {}})
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Submitting again with the same key returns the same execution",
    )
    scheduled_at: Time | None = Field(
        default=None, description="Not claimable before this time (default: now); from 1970 "
        "to 9999 (422 invalid_time otherwise)"
    )
    paused: StrictBool = Field(default=False, description="Submit on hold (status paused)")


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # each item is checked by submit_items (a bad one is named by its index, not refused
    # with the body); the document still says what an item is
    items: list[Any] = Field(
        description="Up to 1,000 submissions (more: 413 payload_too_large), each as the "
                    "body of POST /v1/executions ({ffqn, params?, idempotency_key?, "
                    "scheduled_at?, paused?})",
        json_schema_extra={"maxItems": 1000,
                           "items": {"$ref": "#/components/schemas/SubmitRequest"}})


_SUBMISSIONS = TypeAdapter(list[SubmitRequest])


def validation_text(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "item"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def submit_items(raw: Sequence[Any]) -> tuple[list[SubmitItem], dict[int, VeracityError]]:
    """A batch's items, each checked as the body of POST /v1/executions: the submissions,
    and those that do not fit (by index: why, ``invalid_input``) for
    :meth:`ExecutionService.prepare_many` to list with the rest of what is wrong."""
    try:  # all at once; item by item only to name the bad ones
        return [SubmitItem(one.ffqn, one.params, one.idempotency_key, one.scheduled_at,
                           one.paused) for one in _SUBMISSIONS.validate_python(raw)], {}
    except ValidationError:
        pass
    items: list[SubmitItem] = []
    refused: dict[int, VeracityError] = {}
    for index, item in enumerate(raw):
        try:
            one = SubmitRequest.model_validate(item)
        except ValidationError as exc:
            refused[index] = InvalidInput(validation_text(exc), code="invalid_input")
            items.append(SubmitItem(""))
            continue
        items.append(SubmitItem(one.ffqn, one.params, one.idempotency_key, one.scheduled_at,
                                one.paused))
    return items, refused


class CancelManyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[Any] = Field(
        min_length=1, description="1 to 1,000 execution ids (UUIDs); more: 413 "
                                  "payload_too_large; one not a UUID: 422 invalid_id naming "
                                  "its index, and nothing is cancelled")
    by: str | None = Field(default=None, min_length=1, max_length=200,
                           description="Who cancels them (default: the API token's name)",
                           json_schema_extra={"pattern": r"\S"})


class MessageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: str = Field(min_length=1, max_length=256, description="What recv(topic) waits on "
                       "(no NUL character: 422 invalid_topic)",
                       json_schema_extra={"pattern": NO_NUL})
    payload: Any = Field(default=None, description="Any JSON value")


class CompleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    result: Any = Field(description="The run's result (any JSON value, null included)")


class FailRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: Any = Field(description="What went wrong (any JSON value)")
    transient: StrictBool = Field(default=False,
                            description="failed_transient (infrastructure) instead of failed")


class ResolveRequest(BaseModel):
    """``attach`` needs ``external_execution_id`` and takes no ``force``; ``fail`` and
    ``cancel`` take no ``external_execution_id`` (422 invalid_action, invalid_force
    otherwise: docs/external.md)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"allOf": [{
        "if": {"properties": {"action": {"const": "attach"}}, "required": ["action"]},
        "then": {"required": ["external_execution_id"],
                 "properties": {"external_execution_id": {"type": "string"},
                                "force": {"const": False}}},
        "else": {"properties": {"external_execution_id": {"type": "null"}}},
    }]})

    action: Literal["attach", "fail", "cancel"]
    external_execution_id: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="attach only (and required there): the engine's id of the run")
    reason: str = Field(min_length=1, max_length=2000,
                        description="Why (recorded in history); not only spaces (422 "
                        "invalid_reason)", json_schema_extra={"pattern": r"\S"})
    by: str = Field(default="operator", min_length=1, max_length=200,
                    description="Who resolves it (recorded in history)")
    force: StrictBool = Field(
        default=False,
        description="fail/cancel only: end it even if the engine cannot confirm the run "
                    "finished (recorded as forced, kept on the flagged list)")


class PauseRequest(BaseModel):
    """Who pauses an execution, and why: recorded in its history, said by its
    ``waiting_reason`` (docs/states.md)."""

    model_config = ConfigDict(extra="forbid")

    by: str | None = Field(default=None, min_length=1, max_length=200,
                           description="Who pauses it (default: not named)",
                           json_schema_extra={"pattern": r"\S"})
    reason: str | None = Field(default=None, min_length=1, max_length=2000,
                               description="Why; not only spaces (422 invalid_reason)",
                               json_schema_extra={"pattern": r"\S"})


class MessageOut(BaseModel):
    message_id: int
    execution_id: Uuid
    topic: str
    created_at: datetime


class ExecutionOut(BaseModel):
    id: Uuid
    ffqn: str
    params: list[Any] | None = Field(
        description="The parameters; null only in a list item that left them out (elided)")
    status: Status
    result: Any
    error: Any
    attempt: int
    deployment_id: str
    parent_id: Uuid | None
    idempotency_key: str | None
    scheduled_at: datetime
    created_at: datetime
    updated_at: datetime
    lease_owner: str | None
    lease_epoch: int
    lease_expires_at: datetime | None
    wake_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    pause_requested_at: datetime | None = None
    engine: str | None = None
    external_execution_id: str | None = None
    triggered_at: datetime | None = None
    flagged_at: datetime | None = None
    flag_reason: str | None = None
    flag_kind: str | None = Field(
        default=None, description="Why it is flagged: no_external_id, trigger_unknown, "
        "engine_unconfigured, unknown_id, stop_unconfirmed, forced")
    end_request: Any = Field(
        default=None, description="An operator's request to end a delegated run, waiting "
        "for the engine to confirm the stop: {action, reason, by}")
    end_requested_at: datetime | None = None
    retry_of: Uuid | None = Field(
        default=None, description="For a retry (PUT .../retry): the failed execution it "
        "retries")
    started_at: datetime | None = Field(
        default=None, description="When a worker first claimed it (kept across later "
        "claims); null if it never ran")
    waiting_reason: str | None = Field(
        default=None, description="Why an unfinished execution is not finished yet, in "
        "words (asleep until T, waiting for a message or children, paused by whom, held by "
        "which worker and what recovery will do, scheduled for T, no live worker for it), "
        "in GET /v1/executions/{id} and the list; null once terminal, and in the answers of "
        "other routes (submit, pause, ...): docs/states.md"
    )
    elided: dict[str, int] | None = Field(
        default=None,
        description="In list items only: the values left out because they are larger than "
                    f"{LIST_VALUE_BYTES} bytes (params, result, error), each with its size "
                    "in bytes; GET the execution for them. null when nothing was left out.")

    @classmethod
    def of(cls, e: Execution, waiting_reason: str | None = None, *,
           elide_over: int | None = None) -> ExecutionOut:
        """``elide_over``: leave out params, result and error larger than this many bytes
        (list items: a page's size stays bounded whatever its executions hold)."""
        values = {"params": e.params, "result": e.result, "error": e.error}
        elided: dict[str, int] = {}
        if elide_over is not None:
            for name, value in values.items():
                size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False)
                           .encode())
                if size > elide_over:
                    elided[name] = size
                    values[name] = None
        # constructed, not validated: every value comes typed from the store's Execution
        return cls.model_construct(**cls.fields_of(e, values, elided, waiting_reason))

    @classmethod
    def plain(cls, e: Execution) -> dict[str, Any]:
        """The execution's fields as a dict, for ``pydantic_core.to_json``: the same JSON
        as the model's (a batch answers 1,000 of them without a model each)."""
        # written out in the model's field order (tests/api/test_plain_json.py): one dict
        # per item, without fields_of's and a reordering's
        return {
            "id": str(e.id), "ffqn": e.ffqn, "params": e.params, "status": e.status,
            "result": e.result, "error": e.error, "attempt": e.attempt,
            "deployment_id": e.deployment_id,
            "parent_id": str(e.parent_id) if e.parent_id else None,
            "idempotency_key": e.idempotency_key, "scheduled_at": e.scheduled_at,
            "created_at": e.created_at, "updated_at": e.updated_at,
            "lease_owner": e.lease_owner, "lease_epoch": e.lease_epoch,
            "lease_expires_at": e.lease_expires_at, "wake_at": e.wake_at,
            "cancel_requested_at": e.cancel_requested_at,
            "pause_requested_at": e.pause_requested_at, "engine": e.engine,
            "external_execution_id": e.external_execution_id,
            "triggered_at": e.triggered_at, "flagged_at": e.flagged_at,
            "flag_reason": e.flag_reason, "flag_kind": e.flag_kind,
            "end_request": e.end_request, "end_requested_at": e.end_requested_at,
            "retry_of": str(e.retry_of) if e.retry_of else None,
            "started_at": e.started_at, "waiting_reason": None, "elided": None,
        }

    @classmethod
    def json_many(cls, executions: Sequence[Execution]) -> list[str]:
        """Each execution's JSON text, exactly ``to_json(plain(e))`` (a batch answers 1,000
        of them): the fields written into the model's field order, each value encoded by
        ``to_json`` itself, with the values repeated across the batch (times, workflow and
        deployment names, statuses) encoded once (tests/api/test_plain_json.py)."""
        seen: dict[Any, str] = {}

        def text(value: Any) -> str:
            if value is None:
                return "null"
            if value.__class__ is str:
                key: Any = value
            elif isinstance(value, datetime):  # equal instants in other offsets differ
                key = (value, value.utcoffset())
            else:
                return to_json(value).decode()
            try:
                return seen[key]
            except KeyError:
                done = seen[key] = to_json(value).decode()
                return done

        def head(e: Execution) -> str:
            return (
                f'{{"id":"{e.id}","ffqn":{text(e.ffqn)},"params":{text(e.params)},'
                f'"status":{text(str(e.status))},"result":{text(e.result)},'
                f'"error":{text(e.error)},"attempt":{text(e.attempt)},'
                f'"deployment_id":{text(e.deployment_id)},'
                f'"parent_id":{_id_text(e.parent_id)},'
                f'"idempotency_key":{text(e.idempotency_key)},'
                f'"scheduled_at":{text(e.scheduled_at)},"created_at":{text(e.created_at)},'
                f'"updated_at":{text(e.updated_at)},')

        def tail(e: Execution) -> str:
            if (e.lease_owner is None and e.lease_epoch.__class__ is int
                    and e.lease_epoch == 0 and e.lease_expires_at is None
                    and e.wake_at is None and e.cancel_requested_at is None
                    and e.pause_requested_at is None and e.engine is None
                    and e.external_execution_id is None and e.triggered_at is None
                    and e.flagged_at is None and e.flag_reason is None
                    and e.flag_kind is None and e.end_request is None
                    and e.end_requested_at is None and e.retry_of is None
                    and e.started_at is None):
                return _UNTOUCHED_TAIL  # a row as a submission writes it
            return (
                f'"lease_owner":{text(e.lease_owner)},'
                f'"lease_epoch":{text(e.lease_epoch)},'
                f'"lease_expires_at":{text(e.lease_expires_at)},"wake_at":{text(e.wake_at)},'
                f'"cancel_requested_at":{text(e.cancel_requested_at)},'
                f'"pause_requested_at":{text(e.pause_requested_at)},"engine":{text(e.engine)},'
                f'"external_execution_id":{text(e.external_execution_id)},'
                f'"triggered_at":{text(e.triggered_at)},"flagged_at":{text(e.flagged_at)},'
                f'"flag_reason":{text(e.flag_reason)},"flag_kind":{text(e.flag_kind)},'
                f'"end_request":{text(e.end_request)},'
                f'"end_requested_at":{text(e.end_requested_at)},'
                f'"retry_of":{_id_text(e.retry_of)},"started_at":{text(e.started_at)},'
                f'"waiting_reason":null,"elided":null}}')

        return [head(e) + tail(e) for e in executions]

    @staticmethod
    def fields_of(e: Execution, values: dict[str, Any], elided: dict[str, int],
                  waiting_reason: str | None) -> dict[str, Any]:
        return dict(
            id=str(e.id),
            ffqn=e.ffqn,
            params=values["params"],
            status=e.status,
            result=values["result"],
            error=values["error"],
            elided=elided or None,
            attempt=e.attempt,
            deployment_id=e.deployment_id,
            parent_id=str(e.parent_id) if e.parent_id else None,
            idempotency_key=e.idempotency_key,
            scheduled_at=e.scheduled_at,
            created_at=e.created_at,
            updated_at=e.updated_at,
            lease_owner=e.lease_owner,
            lease_epoch=e.lease_epoch,
            lease_expires_at=e.lease_expires_at,
            wake_at=e.wake_at,
            cancel_requested_at=e.cancel_requested_at,
            pause_requested_at=e.pause_requested_at,
            engine=e.engine,
            external_execution_id=e.external_execution_id,
            triggered_at=e.triggered_at,
            flagged_at=e.flagged_at,
            flag_reason=e.flag_reason,
            flag_kind=e.flag_kind,
            end_request=e.end_request,
            end_requested_at=e.end_requested_at,
            retry_of=str(e.retry_of) if e.retry_of else None,
            started_at=e.started_at,
            waiting_reason=waiting_reason,
        )


_UNTOUCHED_TAIL = (
    '"lease_owner":null,"lease_epoch":0,"lease_expires_at":null,"wake_at":null,'
    '"cancel_requested_at":null,"pause_requested_at":null,"engine":null,'
    '"external_execution_id":null,"triggered_at":null,"flagged_at":null,'
    '"flag_reason":null,"flag_kind":null,"end_request":null,"end_requested_at":null,'
    '"retry_of":null,"started_at":null,"waiting_reason":null,"elided":null}'
)
"""The fields after ``updated_at`` of an execution no worker, operator or engine has
touched yet (:meth:`ExecutionOut.json_many`): all null but ``lease_epoch`` 0."""


def _id_text(value: uuid.UUID | None) -> str:
    return "null" if value is None else f'"{value}"'


class ExecutionPage(BaseModel):
    items: list[ExecutionOut]
    next_cursor: str | None


class BatchOut(BaseModel):
    items: list[ExecutionOut] = Field(description="The executions, in the order submitted")
    created: list[bool] = Field(
        description="For each item: created now (false: its idempotency key named an "
                    "execution already, submitted before or earlier in the batch)")


class CancelOutcome(BaseModel):
    id: str = Field(description="The id as asked")
    execution: ExecutionOut | None = Field(
        default=None, description="The execution as PUT /v1/executions/{id}/cancel answers "
                                  "it (null when error is set)")
    error: ErrorBody | None = Field(
        default=None, description="Why this one was not cancelled: not_found, or "
                                  "not_cancellable (its name does not end in -cancellable)")


class CancelManyOut(BaseModel):
    items: list[CancelOutcome] = Field(description="Each id's outcome, in the order asked")


class HistoryItem(BaseModel):
    seq: int
    kind: str
    at: datetime
    data: Any

    @classmethod
    def of(cls, ev: HistoryEvent) -> HistoryItem:
        return cls(seq=ev.seq, kind=ev.kind, at=ev.at, data=ev.data)


class HistoryPage(BaseModel):
    items: list[HistoryItem]
    next_cursor: str | None = Field(
        default=None, description="Pass as cursor to get the events after this page"
    )


class WorkerOut(BaseModel):
    id: str
    host: str
    pid: int
    deployment_id: str
    workflows: list[str]
    upgrade_auto: list[str] = Field(
        description="The workflows it claims from every deployment (registered with "
        "upgrade=\"auto\"); the others only from its own deployment")
    concurrency: int
    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    heartbeat_interval: float | None = Field(
        description="Seconds between its heartbeats (null: not recorded by the worker)")
    live: bool = Field(
        description="Not stopped, and its next heartbeat late by at most two heartbeat "
        "intervals (never more than the lease TTL): docs/workers.md")

    @classmethod
    def of(cls, view: WorkerView) -> WorkerOut:
        r = view.record
        return cls(id=r.id, host=r.host, pid=r.pid, deployment_id=r.deployment_id,
                   workflows=r.ffqns, upgrade_auto=r.upgrade_ffqns,
                   concurrency=r.concurrency, started_at=r.started_at,
                   last_heartbeat=r.last_heartbeat, stopped_at=r.stopped_at,
                   heartbeat_interval=r.heartbeat_interval, live=view.live)


class WorkerPage(BaseModel):
    items: list[WorkerOut]
    next_cursor: str | None = Field(
        default=None, description="Always null: the answer is one page, the `limit` most "
        "recently started workers")


class CronOut(BaseModel):
    name: str
    ffqn: str
    schedule: str = Field(description="5 fields, or 6 with a leading seconds field")
    timezone: str = Field(description="IANA time zone whose wall clock the schedule reads")
    params: list[Any]
    catch_up: bool
    first_seen_at: datetime | None = Field(
        description="When a server first ran the entry with this schedule and time zone "
                    "(nothing before it fires); null until a server has run it so")
    last_slot: datetime | None = Field(description="The newest slot started")
    last_execution_id: Uuid | None = Field(description="The execution the last slot started")
    last_execution_status: Status | None = Field(description="That execution's status now")
    next_slot: datetime | None = Field(
        description="The first slot after now; null if the schedule never fires again")
    next_slot_local: datetime | None = Field(description="next_slot in the entry's time zone")

    @classmethod
    def of(cls, view: CronView) -> CronOut:
        e, r = view.entry, view.record
        return cls(
            name=e.name, ffqn=e.ffqn, schedule=e.expression, timezone=e.timezone,
            params=list(e.params), catch_up=e.catch_up,
            # recorded with another schedule or time zone: a server has not run this one
            first_seen_at=r.first_seen_at if r and (r.schedule, r.timezone) == (
                e.expression, e.timezone) else None,
            last_slot=r.last_slot_at if r else None,
            last_execution_id=str(r.last_execution_id) if r and r.last_execution_id else None,
            last_execution_status=r.last_status if r else None,
            next_slot=view.next_slot,
            next_slot_local=e.schedule.local(view.next_slot) if view.next_slot else None,
        )


class CronPage(BaseModel):
    items: list[CronOut]

class UnfinishedCounts(BaseModel):
    pending: int
    running: int
    blocked: int
    paused: int


class DeploymentOut(BaseModel):
    id: str
    current: bool = Field(description="The deployment of the server answering")
    first_seen: datetime | None = Field(
        description="When a server or worker of it first started (null: none recorded it; "
        "only executions carry it)")
    last_seen: datetime | None = Field(
        description="When a server or worker of it was last seen running")
    unfinished: UnfinishedCounts = Field(description="Its unfinished executions by status")
    live_workers: int
    stranded: int = Field(
        description="Its unfinished executions no live worker will run: adopt them onto "
        "the current deployment (docs/deployments.md)")

    @classmethod
    def of(cls, view: DeploymentView) -> DeploymentOut:
        d = view.summary
        return cls(id=d.id, current=view.current, first_seen=d.first_seen,
                   last_seen=d.last_seen, unfinished=UnfinishedCounts(**d.unfinished),
                   live_workers=d.live_workers, stranded=d.stranded)


class DeploymentPage(BaseModel):
    items: list[DeploymentOut]
    next_cursor: str | None = Field(
        default=None, description="Always null: every deployment is in the one page")


class AdoptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ffqn_prefix: Annotated[str, Field(min_length=1, max_length=MAX_FFQN_LENGTH),
                           WithJsonSchema({"type": "string", "minLength": 1,
                                           "maxLength": MAX_FFQN_LENGTH,
                                           "pattern": FFQN_PREFIX_PATTERN})] | None = Field(
        default=None,
        description="Only executions whose workflow name starts with this; it must begin "
        "some well-formed workflow name (422 invalid_ffqn_prefix)")
    by: str = Field(default="operator", min_length=1, max_length=200,
                    description="Who adopts (recorded in each execution's history)")


class AdoptOut(BaseModel):
    from_: str = Field(alias="from", description="The deployment they belonged to")
    to: str = Field(description="The current deployment, which they belong to now")
    count: int
    ids: list[Uuid] = Field(description="The executions moved, in id order")

    @classmethod
    def of(cls, outcome: AdoptOutcome) -> AdoptOut:
        return cls.model_validate({"from": outcome.from_id, "to": outcome.to_id,
                                   "count": len(outcome.execution_ids),
                                   "ids": [str(i) for i in outcome.execution_ids]})


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


class Health(BaseModel):
    status: str
    database: str
    backend: str
