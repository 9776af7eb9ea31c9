"""Configuration of external engines: ``[engines.<name>]`` tables and
``[[external_workflow]]`` entries (docs/external.md).

An engine table in ``veracity.toml``::

    [engines.n8n]
    base_url = "http://127.0.0.1:5678"
    api_key_env = "N8N_API_KEY"          # the NAME of the variable; the key stays out
    login_email_env = "N8N_EMAIL"        # optional: for the session stop of n8n 1.x
    login_password_env = "N8N_PASSWORD"
    stop = "auto"                        # public | session | auto (default)
    timeout = 10                         # seconds per engine call (or "10s")

:func:`parse_engine_config` validates one such table and reads the secrets from the
environment; :func:`parse_external` validates the whole of it with the external workflows.
Every problem is a :class:`~veracity.errors.ConfigError` naming the entry.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from veracity.core.ffqn import InvalidFfqn, validate_ffqn
from veracity.errors import ConfigError

if TYPE_CHECKING:
    from veracity.config import Settings

__all__ = [
    "DEFAULT_ENGINE_TIMEOUT",
    "EngineConfig",
    "ExternalConfig",
    "ExternalWorkflow",
    "StopMode",
    "describe_external",
    "parse_engine_config",
    "parse_engines",
    "parse_external",
]

DEFAULT_ENGINE_TIMEOUT = 10.0
"""Seconds one engine call may take before its answer counts as a timeout."""
KEYS = frozenset({"ffqn", "engine", "webhook", "max_duration"})
"""The keys of an ``[[external_workflow]]`` entry."""


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


# ---------------------------------------------------------------------------
# External workflows


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
    from veracity.config import parse_duration  # veracity.config imports this module
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


def describe_external(config: ExternalConfig) -> dict[str, Any]:
    return {"engines": sorted(config.engines), "workflows": sorted(config.workflows)}
