"""The execution service: validation and use cases shared by the HTTP API and the CLI.

Input is checked completely before anything is written, so bad input changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from veracity._ids import new_execution_id, parse_execution_id
from veracity.core.ffqn import CANCELLABLE_SUFFIX, InvalidFfqn, is_cancellable, validate_ffqn
from veracity.core.states import Status
from veracity.errors import (
    BadRequest,
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
)
from veracity.models import (
    JSON,
    ControlResult,
    Execution,
    ExecutionFilter,
    HistoryEvent,
    ListCursor,
    Message,
    NewExecution,
    WorkerRecord,
)
from veracity.store.protocol import Store

MAX_LIST_LIMIT = 1000
MAX_HISTORY_LIMIT = 10_000
MAX_IDEMPOTENCY_KEY = 256
MAX_JSON_DEPTH = 128
MAX_TOPIC_LENGTH = 256
# PostgreSQL's timestamptz ends at 294276 AD; keep far from both ends of every backend
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9999, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Execution]
    next_cursor: str | None
    waiting: dict[uuid.UUID, str] = field(default_factory=dict)
    """For pending executions that no live worker can run: why they wait."""


@dataclass(frozen=True, slots=True)
class WorkerView:
    record: WorkerRecord
    live: bool


def canonical_json(value: JSON) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def request_digest(
    ffqn: str, params: list[JSON], scheduled_at: datetime | None, paused: bool = False
) -> str:
    body: dict[str, JSON] = {
        "ffqn": ffqn,
        "params": params,
        "scheduled_at": scheduled_at.astimezone(UTC).isoformat() if scheduled_at else None,
    }
    if paused:  # only when set, so digests of earlier requests stay the same
        body["paused"] = True
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def encode_cursor(execution: Execution) -> str:
    raw = json.dumps([execution.created_at.isoformat(), str(execution.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> ListCursor:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at, ident = json.loads(base64.urlsafe_b64decode(padded.encode()))
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("naive time")
        return ListCursor(created_at=created_at, id=uuid.UUID(ident))
    except (ValueError, TypeError, AttributeError, binascii.Error, UnicodeDecodeError):
        raise BadRequest(
            "cursor is not one this server gave out; pass next_cursor unchanged",
            code="invalid_cursor",
        ) from None


def parse_id(text: str) -> uuid.UUID:
    try:
        return parse_execution_id(text)
    except ValueError:
        raise BadRequest(
            f"{text[:80]!r} is not an execution id (a UUID)", code="invalid_id"
        ) from None


def check_time(name: str, value: datetime | None) -> None:
    if value is None:
        return
    if value.tzinfo is None:
        raise InvalidInput(f"{name} must include a timezone (e.g. 2030-01-01T00:00:00Z)",
                           code="invalid_time")
    if not MIN_TIME <= value <= MAX_TIME:
        raise InvalidInput(f"{name} must be between 1970 and 9999", code="invalid_time")


def check_depth(what: str, value: JSON) -> None:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH (it could be stored, but not served)."""
    stack: list[tuple[JSON, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise InvalidInput(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels",
                                   code="invalid_json")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


class ExecutionService:
    def __init__(
        self,
        store: Store,
        *,
        workflows: Collection[str],
        deployment_id: str,
        max_payload_bytes: int = 1_048_576,
        live_within: timedelta = timedelta(seconds=120),
        on_submitted: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.workflows = workflows
        self.deployment_id = deployment_id
        self.max_payload_bytes = max_payload_bytes
        self.live_within = live_within
        self.on_submitted = on_submitted

    def _check_workflow(self, ffqn: str) -> None:
        try:
            validate_ffqn(ffqn)
        except InvalidFfqn as exc:
            raise InvalidInput(str(exc), code="invalid_ffqn") from None
        if ffqn not in self.workflows:
            known = ", ".join(sorted(self.workflows)[:10]) or "none are registered"
            raise InvalidInput(
                f"unknown workflow {ffqn!r} (known: {known})", code="unknown_workflow"
            )

    def _check_payload(self, what: str, value: JSON) -> None:
        check_depth(what, value)
        try:
            encoded = canonical_json(value).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{what} is not JSON: {exc}", code="invalid_json") from None
        if len(encoded) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"{what} is {len(encoded)} bytes; the limit is {self.max_payload_bytes}"
            )

    async def submit(
        self,
        ffqn: str,
        params: Sequence[JSON] = (),
        *,
        idempotency_key: str | None = None,
        scheduled_at: datetime | None = None,
        paused: bool = False,
    ) -> tuple[Execution, bool]:
        """Create a pending execution; returns it and whether it was created now."""
        self._check_workflow(ffqn)
        if isinstance(params, str | bytes) or not isinstance(params, Sequence):
            raise InvalidInput("params must be a JSON array", code="invalid_params")
        param_list = list(params)
        self._check_payload("params", param_list)
        if idempotency_key is not None and "\x00" in idempotency_key:
            raise InvalidInput("idempotency_key must not contain NUL characters",
                               code="invalid_idempotency_key")
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
            raise InvalidInput(
                f"idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
                code="invalid_idempotency_key",
            )
        check_time("scheduled_at", scheduled_at)
        digest = request_digest(ffqn, param_list, scheduled_at, paused)
        submitted = await self.store.execution_submit(
            NewExecution(
                ffqn=ffqn,
                params=param_list,
                deployment_id=self.deployment_id,
                id=new_execution_id(),
                idempotency_key=idempotency_key,
                request_digest=digest if idempotency_key else None,
                scheduled_at=scheduled_at,
                paused=paused,
            )
        )
        if submitted.created and self.on_submitted is not None:
            self.on_submitted()
        if not submitted.created and submitted.request_digest != digest:
            raise Conflict(
                f"idempotency key {idempotency_key!r} was used for a different request "
                f"(execution {submitted.execution.id})",
                code="idempotency_conflict",
            )
        return submitted.execution, submitted.created

    async def get(self, execution_id: str | uuid.UUID) -> Execution:
        ident = execution_id if isinstance(execution_id, uuid.UUID) else parse_id(execution_id)
        found = await self.store.execution_get(ident)
        if found is None:
            raise NotFound(f"execution {ident} does not exist")
        return found

    async def page(
        self, filter: ExecutionFilter, *, limit: int = 50, cursor: str | None = None
    ) -> Page:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_LIST_LIMIT}",
                               code="invalid_limit")
        check_time("created_after", filter.created_after)
        check_time("created_before", filter.created_before)
        after = decode_cursor(cursor) if cursor else None
        rows = await self.store.execution_list(filter, limit=limit + 1, after=after)
        items = rows[:limit]
        next_cursor = encode_cursor(items[-1]) if len(rows) > limit else None
        return Page(items, next_cursor, await self.waiting_reasons(items))

    async def workers(self, *, limit: int = 1000) -> list[WorkerView]:
        records = await self.store.worker_list(limit=limit)
        now = await self.store.db_now()
        return [WorkerView(r, r.stopped_at is None and now - r.last_heartbeat <= self.live_within)
                for r in records]

    async def waiting_reasons(self, items: Sequence[Execution]) -> dict[uuid.UUID, str]:
        """Why pending executions wait: no live worker registers their workflow."""
        pending = [e for e in items if e.status == Status.PENDING]
        if not pending:
            return {}
        runnable: set[str] = set()
        for view in await self.workers():
            if view.live:
                runnable.update(view.record.ffqns)
        return {
            e.id: f"no live worker runs {e.ffqn}" for e in pending if e.ffqn not in runnable
        }

    async def history(
        self, execution_id: str | uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryEvent]:
        execution = await self.get(execution_id)
        if not 1 <= limit <= MAX_HISTORY_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_HISTORY_LIMIT}",
                               code="invalid_limit")
        if after_seq < 0:
            raise InvalidInput("after_seq must be 0 or more", code="invalid_after_seq")
        return await self.store.history_list(execution.id, after_seq=after_seq, limit=limit)

    # -- operator requests -------------------------------------------------------------

    def _found(self, ident: uuid.UUID, result: ControlResult) -> Execution:
        if result.execution is None:
            raise NotFound(f"execution {ident} does not exist")
        if result.refused is not None:
            raise Conflict(result.refused, code="wrong_state",
                           state=str(result.execution.status))
        return result.execution

    async def cancel(self, execution_id: str | uuid.UUID, *, actor: str | None = None
                     ) -> tuple[Execution, bool]:
        """Cancel (seed 001): only -cancellable workflows; terminal or repeated: no change."""
        execution = await self.get(execution_id)
        if execution.status.is_terminal:
            return execution, False
        if not is_cancellable(execution.ffqn):
            raise Conflict(
                f"{execution.ffqn} cannot be cancelled (it is {execution.status}): only "
                f"workflows whose name ends in {CANCELLABLE_SUFFIX} can. Pause it instead "
                f"(PUT /v1/executions/{execution.id}/pause): a paused execution stays "
                "visible and uses no worker.",
                code="not_cancellable", state=str(execution.status),
            )
        result = await self.store.execution_cancel(execution.id, actor=actor)
        return self._found(execution.id, result), result.changed

    async def pause(self, execution_id: str | uuid.UUID, *, actor: str | None = None
                    ) -> tuple[Execution, bool]:
        ident = await self._ident(execution_id)
        result = await self.store.execution_pause(ident, actor=actor)
        return self._found(ident, result), result.changed

    async def unpause(self, execution_id: str | uuid.UUID, *, actor: str | None = None
                      ) -> tuple[Execution, bool]:
        ident = await self._ident(execution_id)
        result = await self.store.execution_unpause(ident, actor=actor)
        execution = self._found(ident, result)
        if result.changed and self.on_submitted is not None:
            self.on_submitted()
        return execution, result.changed

    async def send(self, execution_id: str | uuid.UUID, topic: str, payload: JSON
                   ) -> tuple[Execution, Message]:
        ident = await self._ident(execution_id)
        if not isinstance(topic, str) or not 1 <= len(topic) <= MAX_TOPIC_LENGTH \
                or "\x00" in topic:
            raise InvalidInput(f"topic must be 1 to {MAX_TOPIC_LENGTH} characters (no NUL)",
                               code="invalid_topic")
        self._check_payload("payload", payload)
        result = await self.store.message_send(ident, topic, payload)
        execution = self._found(ident, result)
        assert result.message is not None
        if self.on_submitted is not None:
            self.on_submitted()
        return execution, result.message

    # -- external engines ----------------------------------------------------------------

    async def callback(self, execution_id: str | uuid.UUID, token: str | None, report: str,
                       payload: JSON, *, transient: bool = False) -> tuple[Execution, bool]:
        """An engine's /complete or /fail. Returns the execution and whether it changed."""
        ident = await self._ident(execution_id)
        if not token:
            raise Unauthorized("a callback needs its execution's token: "
                               "Authorization: Bearer <token>", code="unauthorized")
        self._check_payload("result" if report == "complete" else "error", payload)
        outcome = await self.store.execution_callback(ident, token, report, payload,
                                                      transient=transient)
        if outcome.outcome == "not_found":
            raise NotFound(f"execution {ident} does not exist")
        if outcome.outcome == "unauthorized":
            raise Unauthorized("the callback token is not this execution's",
                               code="unauthorized")
        assert outcome.execution is not None
        if outcome.outcome == "conflict":
            raise Conflict(
                f"execution is already {outcome.execution.status}; the report is kept in "
                "its history", code="already_ended", state=str(outcome.execution.status))
        return outcome.execution, outcome.outcome == "applied"

    async def resolve(self, execution_id: str | uuid.UUID, *, action: str,
                      external_id: str | None, reason: str, actor: str
                      ) -> tuple[Execution, bool]:
        ident = await self._ident(execution_id)
        if action not in ("attach", "fail", "cancel"):
            raise InvalidInput("action must be attach, fail or cancel", code="invalid_action")
        if action == "attach" and not external_id:
            raise InvalidInput("attach needs external_execution_id", code="invalid_action")
        if not reason.strip():
            raise InvalidInput("a resolution needs a written reason", code="invalid_reason")
        result = await self.store.execution_resolve(
            ident, action=action, external_id=external_id, reason=reason, actor=actor)
        return self._found(ident, result), result.changed

    async def _ident(self, execution_id: str | uuid.UUID) -> uuid.UUID:
        return execution_id if isinstance(execution_id, uuid.UUID) else parse_id(execution_id)
