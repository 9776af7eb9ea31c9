"""Building the FastAPI application around an :class:`ExecutionService`."""

from __future__ import annotations

import asyncio
import functools
import inspect
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import WithJsonSchema
from pydantic_core import to_json
from starlette.routing import BaseRoute

from veracity._ids import parse_execution_id
from veracity.api.auth import ROUTE_ACCESS, TokenAuth, check_routes, declare_security
from veracity.api.bodies import PlainRoute, declared, read_body
from veracity.api.docs import install_docs
from veracity.api.errors import error_response, install_error_handlers
from veracity.api.limits import BodySizeLimit, JsonBodies
from veracity.api.openapi import finish_document
from veracity.api.schemas import (
    LIST_VALUE_BYTES,
    AdoptOut,
    AdoptRequest,
    BatchOut,
    BatchRequest,
    CancelManyOut,
    CancelManyRequest,
    CompleteRequest,
    CronOut,
    CronPage,
    DeploymentOut,
    DeploymentPage,
    ExecutionOut,
    ExecutionPage,
    FailRequest,
    Health,
    HistoryItem,
    HistoryPage,
    MessageOut,
    MessageRequest,
    PauseRequest,
    QueryBool,
    ResolveRequest,
    SubmitRequest,
    Time,
    WorkerOut,
    WorkerPage,
    submit_items,
)
from veracity.config import parse_duration
from veracity.control import MAX_BATCH, MAX_WAIT, ExecutionService
from veracity.core.requests import CallbackReport
from veracity.core.states import Status
from veracity.errors import BadRequest, InvalidInput, PayloadTooLarge, VeracityError
from veracity.models import ExecutionFilter
from veracity.telemetry import HttpMetrics, Telemetry
from veracity.ui.routes import install_dashboard

STATUS_LIST = (r"^\s*(?:(?:" + "|".join(s.value for s in Status) + r")\s*)?"
               r"(?:,\s*(?:(?:" + "|".join(s.value for s in Status) + r")\s*)?)*$")
"""A ``status`` query value: one status, or several separated by commas."""

StatusList = Annotated[str, WithJsonSchema({
    "type": "string", "pattern": STATUS_LIST,
    "description": "One of " + ", ".join(s.value for s in Status) + "; or several, "
                   "comma-separated (422 invalid_status otherwise)"})]

ExecutionId = Annotated[str, Path(
    description="The execution's id, a UUID (400 invalid_id otherwise)",
    json_schema_extra={"format": "uuid"})]

DeploymentId = Annotated[str, Path(
    description="A deployment id: 1 to 128 characters, no NUL (422 invalid_deployment_id "
                "otherwise)", json_schema_extra={"maxLength": 128, "pattern": "^[^\\x00]+$"})]

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]

METRICS_DB_WAIT = 1.0
"""Seconds /metrics waits for the gauges it reads from the database; without an answer
it serves the rest (and the gauges' last values)."""

HEALTH_TIMEOUT = 5.0
"""Seconds ``/healthz`` waits for the database: a database that does not answer is a 503
then, not a request left waiting for the connection pool's own timeout (30 s)."""


async def _service(request: Request) -> ExecutionService:
    # async on purpose: FastAPI runs plain-def dependencies in a thread pool
    service: ExecutionService = request.app.state.service
    return service


Service = Annotated[ExecutionService, Depends(_service)]


def _listed_id(index: int, raw: object) -> uuid.UUID:
    """Item ``index`` of a body's ``ids``: a UUID, or 422 invalid_id naming the index."""
    try:
        if isinstance(raw, str):
            return parse_execution_id(raw)
    except ValueError:
        pass
    shown = raw[:80] if isinstance(raw, str) else raw
    raise InvalidInput(f"ids[{index}]: {shown!r} is not an execution id (a UUID)",
                       code="invalid_id", index=index)


def _token_name(request: Request) -> str | None:
    """The name of the API token the request was made with (api/auth.py), if any: who an
    operator's request is recorded as made by, unless its body names someone."""
    record = getattr(request.state, "api_token", None)  # set by TokenAuth
    name = getattr(record, "name", None)
    return name if isinstance(name, str) else None


def _statuses(values: list[str] | None) -> tuple[Status, ...]:
    out: list[Status] = []
    for value in values or []:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(Status(part))
            except ValueError:
                names = ", ".join(s.value for s in Status)
                raise InvalidInput(
                    f"unknown status {part!r} (one of {names})", code="invalid_status"
                ) from None
    return tuple(out)


def _wait_schema(schema: dict[str, Any]) -> None:
    """``?wait=``'s text is at most 32 characters: said on its string branch, as a
    ``max_length`` would say it, and enforced by :func:`_wait_seconds`."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "string":
            branch["maxLength"] = 32


def _wait_seconds(text: str) -> float:
    try:
        # a duration is short: a long text is no duration (and is not parsed)
        seconds = parse_duration(text.strip()) if len(text) <= 32 else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_WAIT:
        raise InvalidInput(f"wait must be a duration from 0 to {MAX_WAIT:g} s (30s, 1.5s, "
                           f"500ms, or seconds), not {text[:40]!r}", code="invalid_wait")
    return seconds


@functools.cache
def _api_routes() -> tuple[BaseRoute, ...]:
    """The API's routes, built once per process and shared by every app :func:`create_api`
    makes (FastAPI's analysis of each endpoint costs about 20 ms of CPU per app). What
    differs between apps is on ``app.state``: the service, ``health_timeout``, ``telemetry``
    and ``metrics_registry``."""
    router = APIRouter()
    _define_api(router)
    return tuple(router.routes)


def _define_api(app: APIRouter) -> None:
    @app.get("/healthz", response_model=Health)
    async def healthz(service: Service, request: Request) -> Health | JSONResponse:
        health_timeout: float = request.app.state.health_timeout
        try:
            await asyncio.wait_for(service.store.ping(), health_timeout)
        except TimeoutError:
            return error_response(
                503, "database_unavailable",
                f"database check failed: no answer within {health_timeout:g} s",
                headers={"Retry-After": "1"})
        except Exception as exc:
            return error_response(503, "database_unavailable", f"database check failed: {exc}",
                                  headers={"Retry-After": "1"})
        return Health(status="ok", database="ok", backend=service.store.backend)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> PlainTextResponse:
        """Prometheus metrics, text format."""
        state = request.app.state
        telemetry: Telemetry | None = state.telemetry
        metrics_registry: CollectorRegistry = state.metrics_registry
        service: ExecutionService | None = getattr(state, "service", None)
        if service is not None and service.metrics is not None:
            # gauges read from the database, so that what the CLI did counts too
            try:
                counts = await asyncio.wait_for(service.flag_counts(), METRICS_DB_WAIT)
            except Exception:  # metrics answer even when the database does not
                counts = None
            if counts is not None:
                for kind, child in service.metrics.flagged_children():
                    child.set(counts.get(kind, 0))
            try:  # what retention and `veracity prune` deleted, whoever ran them
                pruned = await asyncio.wait_for(service.store.retention_totals(),
                                                METRICS_DB_WAIT)
            except Exception:  # the counter keeps its last values
                pruned = None
            if pruned is not None:
                service.metrics.pruned.values.update(pruned)
        if service is not None and telemetry is not None:
            try:
                statuses = await asyncio.wait_for(service.store.execution_status_counts(),
                                                  METRICS_DB_WAIT)
            except Exception:  # the gauge keeps its last values
                statuses = None
            if statuses is not None:
                telemetry.set_counts(statuses)
        return PlainTextResponse(
            generate_latest(metrics_registry), media_type=CONTENT_TYPE_LATEST
        )

    async def submit(request: Request) -> Response:
        # the body read and checked here, as FastAPI would (veracity/api/bodies.py),
        # and the route run as Starlette runs one (PlainRoute): the API's busiest route
        body = await read_body(request, SubmitRequest)
        service: ExecutionService = request.app.state.service
        execution, created = await service.submit(
            body.ffqn,
            body.params,
            idempotency_key=body.idempotency_key,
            scheduled_at=body.scheduled_at,
            paused=body.paused,
        )
        # the model's JSON text, written without building and validating the model
        # (tests/api/test_plain_json.py): the API's busiest route
        (text,) = ExecutionOut.json_many([execution])
        return Response(text.encode(), media_type="application/json",
                        status_code=201 if created else 200)

    app.add_api_route(
        "/v1/executions", submit, methods=["POST"], route_class_override=PlainRoute,
        status_code=201,
        response_model=ExecutionOut,
        responses={201: {"description": "Created: pending; on PostgreSQL running when an "
                                        "idle worker's offer took it (docs/workers.md, "
                                        "Hand-off to an idle worker)"},
                   200: {"model": ExecutionOut, "description": "Idempotent repeat"}},
        openapi_extra=declared(SubmitRequest),
    )

    @app.post(
        "/v1/executions/batch",
        status_code=201,
        response_model=BatchOut,
        responses={200: {"model": BatchOut, "description": "Nothing created: every item's "
                                                           "idempotency key named an "
                                                           "execution already"}},
    )
    async def submit_batch(body: BatchRequest, service: Service) -> Response:
        """Up to 1,000 submissions in one transaction, answered in order. Each item is
        what POST /v1/executions takes, with its own idempotency key (a key repeated in the
        batch answers the first one's execution). Nothing is written when the batch has
        more than 1,000 items or a body over max_payload_bytes (413), any bad item (422
        invalid_batch, error.items listing each by index with its code and message), or
        a key used before for a different request, or given twice in the batch for
        different requests (409 idempotency_conflict, the same way)."""
        if len(body.items) > MAX_BATCH:
            raise PayloadTooLarge(f"a batch takes at most {MAX_BATCH:,} submissions; this "
                                  f"one has {len(body.items):,}")
        items, refused = submit_items(body.items)
        done = await service.submit_prepared(service.prepare_many(items, refused))
        created = [flag for _, flag in done]
        # serialized here, once, as BatchOut would be (FastAPI would build and validate a
        # model of each of the 1,000 items first), each item's text as to_json gives it
        items_text = ",".join(ExecutionOut.json_many([e for e, _ in done]))
        answer = (f'{{"items":[{items_text}],"created":'
                  f'[{",".join("true" if c else "false" for c in created)}]}}').encode()
        return Response(answer, media_type="application/json",
                        status_code=201 if any(created) else 200)

    @app.get("/v1/executions", response_model=ExecutionPage, )
    async def list_executions(
        service: Service,
        status: Annotated[list[StatusList] | None, Query(
            description="Only these statuses: repeat the parameter, or comma-separate")] = None,
        ffqn_prefix: Annotated[str | None, Query(max_length=512, pattern=r"^[^\x00]*$")] = None,
        deployment_id: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00]*$")] = None,
        created_after: Annotated[Time | None, Query(
            description="Only those created after this time (not at it)")] = None,
        created_before: Annotated[Time | None, Query(
            description="Only those created before this time (not at it)")] = None,
        flagged: Annotated[QueryBool | None, Query(
            description="Only those flagged for an operator (true), or only the others "
                        "(false)")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: Annotated[str | None, Query(max_length=512)] = None,
    ) -> ExecutionPage:
        page = await service.page(
            ExecutionFilter(
                statuses=_statuses(status),
                ffqn_prefix=ffqn_prefix,
                deployment_id=deployment_id,
                created_after=created_after,
                created_before=created_before,
                flagged=flagged,
            ),
            limit=limit,
            cursor=cursor,
        )
        return ExecutionPage(
            items=[ExecutionOut.of(e, page.waiting.get(e.id), elide_over=LIST_VALUE_BYTES)
                   for e in page.items],
            next_cursor=page.next_cursor,
        )

    # declared before the /v1/executions/{execution_id} routes: "cancel" is not an id
    @app.put("/v1/executions/cancel", response_model=CancelManyOut)
    async def cancel_many(body: CancelManyRequest, service: Service,
                          request: Request) -> Response:
        """Cancel up to 1,000 executions in one transaction, each exactly as PUT
        /v1/executions/{id}/cancel would (terminal or cancelled already: unchanged; running:
        cancel requested), answered in the order asked: each item has the execution, or
        the error its single cancel would answer (not_found, not_cancellable), which does
        not stop the others. Nothing is written for more than 1,000 ids (413) or an id that
        is not a UUID (422 invalid_id, error.index naming the first such)."""
        if len(body.ids) > MAX_BATCH:
            raise PayloadTooLarge(f"one request cancels at most {MAX_BATCH:,} executions; "
                                  f"this one names {len(body.ids):,}")
        ids = [_listed_id(index, raw) for index, raw in enumerate(body.ids)]
        if body.by is not None and not body.by.strip():
            raise InvalidInput("by: must not be only spaces", code="invalid_input")
        done = await service.cancel_many(ids, actor=body.by or _token_name(request))
        items = [
            {"id": str(ident), "execution": None,
             "error": {"code": out.code, "message": str(out)}}
            if isinstance(out, VeracityError) else
            {"id": str(ident), "execution": ExecutionOut.plain(out), "error": None}
            for ident, out in zip(ids, done, strict=True)]
        return Response(to_json({"items": items}), media_type="application/json")

    @app.get("/v1/executions/{execution_id}", response_model=ExecutionOut, )
    async def get_execution(
        execution_id: ExecutionId, service: Service,
        wait: Annotated[str | None, Query(
            # said, and refused as invalid_wait (not FastAPI's invalid_input) by
            # _wait_seconds
            json_schema_extra=_wait_schema,
            description="Long poll: answer as soon as the execution is "
            "terminal, or with its current state after this long (0 to 60 s: 30s, 1.5s, "
            "500ms, or a number of seconds); out of range: 422 invalid_wait")] = None,
    ) -> ExecutionOut:
        if wait is None:
            execution = await service.get(execution_id)
        else:
            execution = await service.wait(execution_id, _wait_seconds(wait))
        waiting = await service.waiting_reasons([execution])
        return ExecutionOut.of(execution, waiting.get(execution.id))

    @app.put("/v1/executions/{execution_id}/cancel", response_model=ExecutionOut,
             )
    async def cancel(execution_id: ExecutionId, service: Service,
                     request: Request) -> ExecutionOut:
        """Cancel an execution whose workflow name ends in -cancellable, and recursively its
        cancellable children. A running one stops at its next await; a run delegated to an
        external engine is asked to stop there and ends cancelled once the engine confirms
        it finished (until then it stays running with cancel_requested_at). Cancelling a
        terminal execution, or twice, answers 200 and changes nothing; any other name
        answers 409."""
        execution, _ = await service.cancel(execution_id, actor=_token_name(request))
        return ExecutionOut.of(execution)

    @app.put("/v1/executions/{execution_id}/retry", status_code=201,
             response_model=ExecutionOut, )
    async def retry(execution_id: ExecutionId, service: Service,
                    request: Request) -> ExecutionOut:
        """Retry a failed or failed_transient execution: 201 and a new execution linked to
        it (retry_of), which replays the failed run's recorded calls up to its failure and
        runs on from there. The failed one is left unchanged. Any other status: 409
        wrong_state."""
        return ExecutionOut.of(await service.retry(execution_id, actor=_token_name(request)))

    @app.put("/v1/executions/{execution_id}/pause", response_model=ExecutionOut,
             )
    async def pause(execution_id: ExecutionId, service: Service, request: Request,
                    body: PauseRequest | None = None) -> ExecutionOut:
        """Hold any non-terminal execution: pending and blocked ones at once, a running one at
        its next step boundary (it releases its lease). An optional body says who pauses it
        and why (recorded in its history, said by its waiting_reason). 409 wrong_state for
        a terminal one; 409 not_pausable for a run delegated to an external engine (it
        cannot pause it: cancel or resolve it instead)."""
        asked = body or PauseRequest()
        execution, _ = await service.pause(execution_id,
                                           actor=asked.by or _token_name(request),
                                           reason=asked.reason)
        return ExecutionOut.of(execution)

    @app.put("/v1/executions/{execution_id}/unpause", response_model=ExecutionOut,
             )
    async def unpause(execution_id: ExecutionId, service: Service,
                      request: Request) -> ExecutionOut:
        """Back to pending (or blocked, if it still waits for something). 409 if not paused."""
        execution, _ = await service.unpause(execution_id, actor=_token_name(request))
        return ExecutionOut.of(execution)

    @app.post("/v1/executions/{execution_id}/messages", status_code=201,
              response_model=MessageOut, )
    async def send_message(
        execution_id: ExecutionId, body: MessageRequest, service: Service
    ) -> MessageOut:
        """Store a message durably for recv(topic); wakes the execution if it waits.
        409 for a terminal execution."""
        execution, message = await service.send(execution_id, body.topic, body.payload)
        return MessageOut(message_id=message.id, execution_id=str(execution.id),
                          topic=message.topic, created_at=message.created_at)

    def _bearer(authorization: str | None) -> str | None:
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    @app.post("/v1/executions/{execution_id}/complete", response_model=ExecutionOut,
)
    async def complete(
        execution_id: ExecutionId, body: CompleteRequest, service: Service,
        authorization: Annotated[str | None, Header()] = None,
    ) -> ExecutionOut:
        """The engine's callback: the run completed with this result. Authenticated by the
        execution's callback token (Authorization: Bearer). The same completion again: 200,
        nothing changes; an execution that ended otherwise: 409, the report kept."""
        execution, _ = await service.callback(execution_id, _bearer(authorization),
                                              CallbackReport.COMPLETE, body.result)
        return ExecutionOut.of(execution)

    @app.post("/v1/executions/{execution_id}/fail", response_model=ExecutionOut,
)
    async def fail(
        execution_id: ExecutionId, body: FailRequest, service: Service,
        authorization: Annotated[str | None, Header()] = None,
    ) -> ExecutionOut:
        """The engine's callback: the run failed (failed, or failed_transient)."""
        execution, _ = await service.callback(execution_id, _bearer(authorization),
                                              CallbackReport.FAIL, body.error,
                                              transient=body.transient)
        return ExecutionOut.of(execution)

    @app.put("/v1/executions/{execution_id}/resolve", response_model=ExecutionOut,
             responses={202: {"model": ExecutionOut,
                              "description": "Stop requested; still running until the "
                                             "engine confirms the run finished"}})
    async def resolve(execution_id: ExecutionId, body: ResolveRequest, service: Service,
                      response: Response) -> ExecutionOut:
        """An operator resolves a flagged (or any running delegated) execution: attach the
        engine's id, or end the run as failed_transient (fail) or cancelled (cancel) once
        its engine confirms the run finished (200; 202 while the engine has accepted the
        stop but not confirmed it; 409 engine_not_confirmed when it could not be asked or
        refused: the request stays recorded). ``force`` ends it without the engine's
        confirmation, flagged as forced. The header X-Veracity-Resolution says which
        (attached, ended, stop_requested, forced, unconfirmed). See docs/external.md."""
        resolved = await service.resolve(
            execution_id, action=body.action, external_id=body.external_execution_id,
            reason=body.reason, actor=body.by, force=body.force)
        response.headers["X-Veracity-Resolution"] = resolved.outcome
        if resolved.outcome == "stop_requested":
            response.status_code = 202
        return ExecutionOut.of(resolved.execution)

    @app.get("/v1/workers", response_model=WorkerPage, )
    async def list_workers(
        service: Service, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> WorkerPage:
        return WorkerPage(items=[WorkerOut.of(w) for w in await service.workers(limit=limit)])

    @app.get("/v1/crons", response_model=CronPage, )
    async def list_crons(service: Service) -> CronPage:
        """The [[cron]] entries of this server's configuration, in its order: each with its
        last slot, the execution that slot started and that execution's status, and the
        next slot (docs/cron.md)."""
        return CronPage(items=[CronOut.of(v) for v in await service.crons()])

    @app.get("/v1/deployments", response_model=DeploymentPage, )
    async def list_deployments(service: Service) -> DeploymentPage:
        """Every deployment, newest first: when a server or worker of it was first and
        last seen, its unfinished executions by status, its live workers, and how many of
        its executions are stranded (no live worker will run them). See
        docs/deployments.md."""
        return DeploymentPage(items=[DeploymentOut.of(d) for d in await service.deployments()])

    @app.post("/v1/deployments/{deployment_id}/adopt", response_model=AdoptOut,
              )
    async def adopt(deployment_id: DeploymentId, service: Service,
                    body: AdoptRequest | None = None) -> AdoptOut:
        """Move the unfinished executions of an older deployment (those whose workflow name
        starts with ffqn_prefix, if given; with no live worker of it, its stranded ones and
        any that a worker upgrading automatically would run) onto this server's
        deployment, each with an ``adopted`` event {from, to, by} in its history; answers
        how many and which.
        404 for an unknown deployment; 409 deployment_live while it has a live worker,
        unknown_target if this server's deployment was never recorded; 422 for the current
        deployment itself or a prefix no workflow name can start with."""
        request = body or AdoptRequest()
        outcome = await service.adopt(deployment_id, ffqn_prefix=request.ffqn_prefix,
                                      actor=request.by)
        return AdoptOut.of(outcome)

    @app.get(
        "/v1/executions/{execution_id}/history", response_model=HistoryPage
    )
    async def history(
        execution_id: ExecutionId,
        service: Service,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        cursor: Annotated[str | None, Query(max_length=32)] = None,
    ) -> HistoryPage:
        after_seq = 0
        if cursor is not None:
            if not (cursor.isascii() and cursor.isdigit()) or int(cursor) > 2**31 - 1:
                raise BadRequest("cursor must be a next_cursor value from this endpoint",
                                 code="invalid_cursor")
            after_seq = int(cursor)
        page, after = await service.history_page(execution_id, after_seq=after_seq,
                                                 limit=limit)
        return HistoryPage(items=[HistoryItem.of(e) for e in page],
                           next_cursor=str(after) if after is not None else None)


_NO_FASTAPI_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False,
                   "operation_spans": False, "auto_configure": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})
"""FastAPI's own OpenTelemetry instrumentation (FastAPI 0.16x) turned off: Veracity's
metrics are its Prometheus endpoint (docs/operations.md). Left on, FastAPI looked up
OpenTelemetry's providers (and the environment) on every request, though none is
configured: some 3 % of the server's CPU a submission (docs/scaling.md)."""


def create_api(
    service: ExecutionService | None = None,
    *,
    max_payload_bytes: int = 1_048_576,
    lifespan: Lifespan | None = None,
    registry: CollectorRegistry | None = None,
    health_timeout: float = HEALTH_TIMEOUT,
    auth_required: bool = False,
    telemetry: Telemetry | None = None,
) -> FastAPI:
    """The API. Pass a ready ``service``, or a ``lifespan`` that puts one on
    ``app.state.service`` at start (the server does that, to open the store there).

    ``auth_required``: every request to a scoped route needs an API token (the server
    passes auth.required); without it, a request without a token is served, and one with a
    token is still checked (docs/security.md)."""

    @asynccontextmanager
    async def no_lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield

    app = FastAPI(
        title="Veracity",
        version="0.1.0",
        description="Durable workflow executions that never lie about their state.",
        lifespan=lifespan or no_lifespan,
        docs_url=None,  # served offline by install_docs (api/docs.py)
        redoc_url=None,
        **_NO_FASTAPI_TELEMETRY,
    )
    install_docs(app)
    if service is not None:
        app.state.service = service
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_payload_bytes)
    app.add_middleware(JsonBodies)
    # added last, so outermost: a request is refused for its token before its body is read
    app.add_middleware(TokenAuth, required=auth_required)
    if telemetry is not None:  # outermost: every answer counted, a refused token's too
        app.add_middleware(HttpMetrics, telemetry=telemetry, routes=app.router.routes)

    app.state.health_timeout = health_timeout
    app.state.telemetry = telemetry
    metrics_registry = registry or (telemetry.registry if telemetry is not None
                                    else CollectorRegistry())
    app.state.metrics_registry = metrics_registry
    app.router.routes.extend(_api_routes())  # built once per process

    install_dashboard(app, auth_required=auth_required)  # /ui (docs/dashboard.md)
    check_routes(app.router.routes, ROUTE_ACCESS)  # a route without its access is a bug
    declare_security(app, auth_required)
    secured = app.openapi

    def openapi() -> dict[str, Any]:
        if getattr(app.state, "openapi_finished", False) and app.openapi_schema is not None:
            return app.openapi_schema
        service: ExecutionService | None = getattr(app.state, "service", None)
        app.openapi_schema = finish_document(
            secured(), service.workflows if service is not None else ())
        app.state.openapi_finished = True
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
