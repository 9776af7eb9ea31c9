"""The external-engine seam: one small protocol, its results, and engine configuration.

An adapter does three things for Veracity (see docs/external.md): start a run, inspect a
run, stop a run. None of them raises for anything the engine or the network does: every
answer comes back as a value the caller can decide on, and anything the adapter cannot
trust is reported as :attr:`EngineState.UNKNOWN` with an :class:`EngineErrorKind`.

Configuration: an ``[engines.<name>]`` table in ``veracity.toml``::

    [engines.n8n]
    base_url = "http://127.0.0.1:5678"
    api_key_env = "N8N_API_KEY"          # the NAME of the variable; the key stays out
    login_email_env = "N8N_EMAIL"        # optional: for the session stop of n8n 1.x
    login_password_env = "N8N_PASSWORD"
    stop = "auto"                        # public | session | auto (default)
    timeout = 10                         # seconds per engine call (or "10s")

:func:`parse_engine_config` validates one such table and reads the secrets from the
environment; every problem is a :class:`~veracity.errors.ConfigError` naming the entry.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from veracity.core.reconcile import EngineState
from veracity.errors import ConfigError

__all__ = [
    "DEFAULT_ENGINE_TIMEOUT",
    "CallbackInfo",
    "Engine",
    "EngineConfig",
    "EngineErrorKind",
    "Inspection",
    "StartOutcome",
    "StartResult",
    "StopMode",
    "StopResult",
    "parse_engine_config",
    "parse_engines",
]

DEFAULT_ENGINE_TIMEOUT = 10.0
"""Seconds one engine call may take before its answer counts as a timeout."""


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


# ---------------------------------------------------------------------------
# Configuration


class StopMode(StrEnum):
    PUBLIC = "public"
    """The public API's stop endpoint (newer n8n versions)."""
    SESSION = "session"
    """The internal REST stop behind a login session (n8n 1.x)."""
    AUTO = "auto"
    """The public stop; when n8n's API answers it 404 or 405 (no such endpoint: n8n 1.x),
    the session stop."""


ENGINE_TYPES: frozenset[str] = frozenset({"n8n"})

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYS = frozenset(
    {
        "type",
        "base_url",
        "api_key_env",
        "login_email_env",
        "login_password_env",
        "stop",
        "timeout",
    }
)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One validated ``[engines.<name>]`` entry, with its secrets read from the environment."""

    name: str
    base_url: str
    """Without a trailing slash."""
    api_key_env: str
    api_key: str = field(repr=False)
    type: str = "n8n"
    login_email_env: str | None = None
    login_password_env: str | None = None
    login_email: str | None = field(default=None, repr=False)
    login_password: str | None = field(default=None, repr=False)
    stop: StopMode = StopMode.AUTO
    timeout: float = DEFAULT_ENGINE_TIMEOUT

    @property
    def entry(self) -> str:
        return f"engines.{self.name}"

    @property
    def has_login(self) -> bool:
        return bool(self.login_email and self.login_password)


def parse_engines(
    tables: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, EngineConfig]:
    """Validate the whole ``[engines]`` table: name -> :class:`EngineConfig`."""
    if not isinstance(tables, Mapping):
        raise ConfigError("engines: expected a table of [engines.<name>] entries")
    return {
        str(name): parse_engine_config(str(name), table, environ) for name, table in tables.items()
    }


def parse_engine_config(
    name: str, table: Any, environ: Mapping[str, str] | None = None
) -> EngineConfig:
    """Validate one ``[engines.<name>]`` table and read its secrets from ``environ``.

    ``environ`` defaults to ``os.environ``. Raises :class:`ConfigError` naming the entry,
    e.g. ``engines.n8n: api_key_env N8N_API_KEY is not set in the environment``.
    """
    if environ is None:
        environ = os.environ
    entry = f"engines.{name}"

    def fail(message: str) -> ConfigError:
        return ConfigError(f"{entry}: {message}")

    if not name or not _ENV_NAME.fullmatch(name.replace("-", "_")):
        raise fail("an engine name is letters, digits, '_' or '-'")
    if not isinstance(table, Mapping):
        raise fail("expected a table")
    if "api_key" in table:
        raise fail(
            "api_key: the key itself never sits in the file; "
            "name an environment variable with api_key_env"
        )
    for key in table:
        if key not in _KEYS:
            raise fail(f"{key}: unknown key (expected one of {', '.join(sorted(_KEYS))})")

    engine_type = table.get("type", "n8n")
    if not isinstance(engine_type, str) or engine_type not in ENGINE_TYPES:
        raise fail(f"type: unknown engine type {engine_type!r} (supported: n8n)")

    base_url = _base_url(table.get("base_url"), fail)

    api = _secret(table, "api_key_env", environ, fail)
    if api is None:
        raise fail("api_key_env: required (the name of an environment variable)")
    api_key_env, api_key = api
    login = _secret(table, "login_email_env", environ, fail)
    password = _secret(table, "login_password_env", environ, fail)
    if (login is None) != (password is None):
        raise fail("login_email_env and login_password_env go together: give both or neither")

    stop_raw = table.get("stop", StopMode.AUTO.value)
    if not isinstance(stop_raw, str) or stop_raw not in set(StopMode):
        raise fail(f"stop: expected 'public', 'session' or 'auto', got {stop_raw!r}")
    stop = StopMode(stop_raw)
    if stop is StopMode.SESSION and login is None:
        raise fail("stop = 'session' needs login_email_env and login_password_env")

    # Imported here: veracity.config may come to import this module to parse [engines].
    from veracity.config import parse_duration

    timeout_raw = table.get("timeout", DEFAULT_ENGINE_TIMEOUT)
    try:
        timeout = parse_duration(timeout_raw)
    except ValueError as exc:
        raise fail(f"timeout: {exc}") from None
    if timeout <= 0:
        raise fail("timeout: must be more than zero")

    return EngineConfig(
        name=name,
        base_url=base_url,
        api_key_env=api_key_env,
        api_key=api_key.strip(),
        type=engine_type,
        login_email_env=login[0] if login else None,
        login_password_env=password[0] if password else None,
        login_email=login[1].strip() if login else None,
        login_password=password[1] if password else None,
        stop=stop,
        timeout=timeout,
    )


_Fail = Callable[[str], ConfigError]


def _secret(
    table: Mapping[str, Any], key: str, environ: Mapping[str, str], fail: _Fail
) -> tuple[str, str] | None:
    """(variable name, value) for an ``*_env`` key, or None when the key is absent."""
    var = table.get(key)
    if var is None:
        return None
    if not isinstance(var, str) or not _ENV_NAME.fullmatch(var):
        raise fail(
            f"{key}: expected the name of an environment variable, "
            "such as N8N_API_KEY (never the secret itself)"
        )
    value = environ.get(var, "")
    if not value.strip():
        raise fail(f"{key} {var} is not set in the environment")
    return var, value


def _base_url(value: Any, fail: _Fail) -> str:
    if value is None:
        raise fail("base_url: required (such as http://127.0.0.1:5678)")
    if not isinstance(value, str) or not value.strip():
        raise fail("base_url: expected an http:// or https:// URL")
    text = value.strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise fail(f"base_url: invalid URL {text!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(f"base_url: expected an http:// or https:// URL, got {text!r}")
    if parts.query or parts.fragment:
        raise fail(f"base_url: no query or fragment allowed, got {text!r}")
    return text.rstrip("/")
