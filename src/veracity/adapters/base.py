"""The external-engine seam: one small protocol and its results.

An adapter does three things for Veracity (see docs/external.md): start a run, inspect a
run, stop a run. None of them raises for anything the engine or the network does: every
answer comes back as a value the caller can decide on, and anything the adapter cannot
trust is reported as :attr:`EngineState.UNKNOWN` with an :class:`EngineErrorKind`. Their
configuration is :mod:`veracity.adapters.config`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from veracity.core.reconcile import EngineState

__all__ = [
    "CallbackInfo",
    "Engine",
    "EngineErrorKind",
    "Inspection",
    "StartOutcome",
    "StartResult",
    "StopResult",
]


# ---------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class CallbackInfo:
    """Where and how the engine reports a run's outcome back to Veracity."""

    complete_url: str
    fail_url: str
    token: str = field(repr=False)
    """The per-execution callback token (sent to the engine; stored hashed by Veracity)."""


class StartOutcome(StrEnum):
    STARTED = "started"
    """The engine took the run and named its id."""

    REFUSED = "refused"
    """A clear refusal (4xx) before any run existed: fail the execution with the message."""

    AMBIGUOUS = "ambiguous"
    """The request was sent and the run may exist (timeout, 5xx, connection lost after
    sending, or a success without an id): never trigger again; it stays running without
    an external id, flagged for an operator (the table's fourth row)."""

    UNAVAILABLE = "unavailable"
    """Nothing was started, for certain (connection refused before anything was sent, or
    429): the trigger may be tried again later."""


@dataclass(frozen=True, slots=True)
class StartResult:
    outcome: StartOutcome
    external_id: str | None = None
    message: str = ""
    """The engine's own message for a refusal; what happened, otherwise."""
    status_code: int | None = None

    def __post_init__(self) -> None:
        if (self.outcome is StartOutcome.STARTED) != bool(self.external_id):
            raise ValueError("a started run, and only a started run, carries an external id")

    @classmethod
    def started(cls, external_id: str, status_code: int | None = None) -> StartResult:
        return cls(StartOutcome.STARTED, external_id, "", status_code)

    @classmethod
    def refused(cls, message: str, status_code: int | None = None) -> StartResult:
        return cls(StartOutcome.REFUSED, None, message, status_code)

    @classmethod
    def ambiguous(cls, message: str, status_code: int | None = None) -> StartResult:
        return cls(StartOutcome.AMBIGUOUS, None, message, status_code)

    @classmethod
    def unavailable(cls, message: str, status_code: int | None = None) -> StartResult:
        return cls(StartOutcome.UNAVAILABLE, None, message, status_code)


class EngineErrorKind(StrEnum):
    """Why an engine answer is unknown (also the label of the engine-error metric)."""

    UNREACHABLE = "unreachable"
    """No connection, or the connection broke before an answer."""
    TIMEOUT = "timeout"
    SERVER_ERROR = "server_error"
    """A 5xx answer."""
    NOT_FOUND = "not_found"
    """404 in the engine API's own words: it does not know the id (forgotten, pruned, or
    never its id). n8n: ``{"message": "Not Found"}``."""
    NOT_READY = "not_ready"
    """The engine's API is not answering yet (starting up?). n8n, after a crash or a
    restart, answers 200 ``n8n is starting up. Please wait`` while it migrates its
    database, then 404 with Express's HTML page ``Cannot GET /api/v1/...`` until its API is
    mounted: no word about the id. Asked again next tick; never flagged."""
    BAD_REQUEST = "bad_request"
    """400: the engine rejects the id itself (n8n: not a number)."""
    UNAUTHORIZED = "unauthorized"
    """401/403: a wrong, missing or under-scoped API key."""
    HTTP_ERROR = "http_error"
    """Any other unexpected HTTP status."""
    BAD_JSON = "bad_json"
    """The body is not JSON, or not a JSON object."""
    MISSING_FIELDS = "missing_fields"
    """A JSON object without the fields needed, or with fields of the wrong type."""
    UNKNOWN_STATUS = "unknown_status"
    """A status the adapter does not know (n8n's own ``unknown`` included)."""
    INCONSISTENT = "inconsistent"
    """An answer that contradicts itself (a terminal status without a stop time, or the
    answer for another id)."""


@dataclass(frozen=True, slots=True)
class Inspection:
    """What the engine said about one run.

    ``state`` is what the decision table uses; the raw fields are kept for history and
    logs. ``error`` is set exactly when ``state`` is unknown.
    """

    state: EngineState
    status: str | None = None
    stopped_at: str | None = None
    wait_till: str | None = None
    error: EngineErrorKind | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if (self.state is EngineState.UNKNOWN) != (self.error is not None):
            raise ValueError("an unknown state, and only an unknown state, has an error kind")

    @property
    def not_found(self) -> bool:
        """The engine's API answered 404 for the id: unknown, and flagged for an operator.
        A 404 that is not the API's own answer is :attr:`EngineErrorKind.NOT_READY`."""
        return self.error is EngineErrorKind.NOT_FOUND

    @property
    def needs_operator(self) -> bool:
        """The engine says this id is not (or cannot be) one of its runs: its API's 404, or
        400 for an id it rejects. Asking again will not help; flag the execution for an
        operator. An engine that is not answering yet (:attr:`EngineErrorKind.NOT_READY`)
        says nothing about the id: it is asked again, never flagged."""
        return self.error in (EngineErrorKind.NOT_FOUND, EngineErrorKind.BAD_REQUEST)

    @classmethod
    def unknown(
        cls, error: EngineErrorKind, detail: str, *, status: str | None = None
    ) -> Inspection:
        return cls(EngineState.UNKNOWN, status=status, error=error, detail=detail)


@dataclass(frozen=True, slots=True)
class StopResult:
    """Whether the engine accepted a stop request.

    ``ok`` only means the request was accepted: it never proves the run has finished.
    After any stop attempt the caller inspects the run again and decides from that.
    """

    ok: bool
    reason: str = ""
    method: str | None = None
    """How the stop was asked ("public", "session"), when it got that far."""
    status_code: int | None = None


# ---------------------------------------------------------------------------
# The protocol


@runtime_checkable
class Engine(Protocol):
    """An external workflow engine, as the worker and the reconciler see it."""

    @property
    def name(self) -> str:
        """The configuration entry's name (``engines.<name>``)."""
        ...

    async def start(
        self,
        execution_id: str,
        params: Any,
        callback: CallbackInfo,
        *,
        target: str,
    ) -> StartResult:
        """Trigger one run of the workflow at ``target`` (n8n: the webhook path or URL).

        Called at most once per execution: an ambiguous answer is never retried.
        """
        ...

    async def inspect(self, external_id: str) -> Inspection:
        """Ask the engine about one run, by id (never by listing)."""
        ...

    async def stop(self, external_id: str) -> StopResult:
        """Ask the engine to stop one run. Inspect again afterwards to learn the outcome."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
