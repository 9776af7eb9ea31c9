"""Configuration loading: defaults < ``veracity.toml`` < ``VERACITY_*`` environment < CLI flags.

``load_settings`` merges the four sources into one frozen ``Settings`` and turns every
validation failure into a one-line ``ConfigError`` naming where the bad value came from:
``veracity.toml:3: worker.concurrency: ...``, ``VERACITY_PORT: ...`` or ``--port: ...``.
A key this version does not implement is never ignored: a misspelled one is an ``unknown
key``, one that names a feature Veracity does not have yet (listed in ``NOT_SUPPORTED``; none
today) is ``not
supported by this version of Veracity``, and ``tokens`` and ``secrets`` are refused saying
where they live instead (API tokens: the database, ``veracity token create``; secret values:
the environment or a secrets file).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from veracity.bindings import HttpBinding, check_bindings
from veracity.errors import ConfigError

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_FILE",
    "ENV_VARS",
    "AuthSettings",
    "ReconcilerSettings",
    "RecoverySettings",
    "RetentionSettings",
    "ServerSettings",
    "Settings",
    "WorkerSettings",
    "describe",
    "is_loopback",
    "load_settings",
    "parse_duration",
]

CONFIG_ENV_VAR = "VERACITY_CONFIG"
DEFAULT_CONFIG_FILE = "veracity.toml"

# Dotted setting key -> environment variable. Every key here can also be given as a flag.
ENV_VARS: dict[str, str] = {
    "database_url": "VERACITY_DATABASE_URL",
    "app": "VERACITY_APP",
    "host": "VERACITY_HOST",
    "port": "VERACITY_PORT",
    "deployment_id": "VERACITY_DEPLOYMENT_ID",
    "max_payload_bytes": "VERACITY_MAX_PAYLOAD_BYTES",
    "log_level": "VERACITY_LOG_LEVEL",
    "gc_young_threshold": "VERACITY_GC_YOUNG_THRESHOLD",
    "worker.concurrency": "VERACITY_WORKER_CONCURRENCY",
    "worker.lease_ttl": "VERACITY_LEASE_TTL",
    "worker.heartbeat_interval": "VERACITY_HEARTBEAT_INTERVAL",
    "worker.poll_interval": "VERACITY_POLL_INTERVAL",
    "worker.shutdown_grace": "VERACITY_SHUTDOWN_GRACE",
    "worker.notifications": "VERACITY_WORKER_NOTIFICATIONS",
    "worker.handoff": "VERACITY_WORKER_HANDOFF",
    "worker.metrics_port": "VERACITY_WORKER_METRICS_PORT",
    "worker.metrics_host": "VERACITY_WORKER_METRICS_HOST",
    "server.read_timeout": "VERACITY_READ_TIMEOUT",
    "server.max_connections": "VERACITY_MAX_CONNECTIONS",
    "recovery.interval": "VERACITY_RECOVERY_INTERVAL",
    "recovery.max_attempts": "VERACITY_MAX_ATTEMPTS",
    "reconciler.interval": "VERACITY_RECONCILER_INTERVAL",
    "reconciler.concurrency": "VERACITY_RECONCILER_CONCURRENCY",
    "reconciler.engine_timeout": "VERACITY_ENGINE_TIMEOUT",
    "reconciler.stop_flag_after": "VERACITY_STOP_FLAG_AFTER",
    "public_url": "VERACITY_PUBLIC_URL",
    "secrets_file": "VERACITY_SECRETS_FILE",
    "auth.required": "VERACITY_AUTH_REQUIRED",
    "retention.terminal": "VERACITY_RETENTION_TERMINAL",
    "retention.interval": "VERACITY_RETENTION_INTERVAL",
}

# Top-level keys of features this version does not have: refused at start, never ignored.
# (none today: retention, the last one, is here now)
NOT_SUPPORTED: frozenset[str] = frozenset()
_NOT_SUPPORTED_REASON = "not supported by this version of Veracity"
# Top-level keys for what lives elsewhere: refused, saying where.
ELSEWHERE: dict[str, str] = {
    "secrets": "secret values never sit in veracity.toml: set VERACITY_SECRET_<NAME> or name "
               "a secrets_file, and refer to them as ${secret:NAME} in an [[http]] entry's "
               "headers (docs/http.md)",
    # a token in a file would be a secret in plain text beside the settings, and the API
    # checks the database's tokens: one place, hashed, listed and revoked there
    "tokens": "API tokens live in the database, hashed, not in the configuration file: "
              "create them with `veracity token create` (docs/security.md)",
}

# ---------------------------------------------------------------------------
# Durations

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ms|s|m|h|d))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_DURATION_HINT = (
    "expected seconds (e.g. 90 or 1.5) or a duration such as '90s', '10m', '1h30m', '500ms'"
)


def parse_duration(value: str | int | float) -> float:
    """Seconds from a number of seconds or a duration string ("90s", "10m", "1h30m", "500ms").

    Raises ``ValueError`` for anything else, and for negative or non-finite durations.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"invalid duration {value!r}: {_DURATION_HINT}")
    if isinstance(value, str):
        text = re.sub(r"\s+", "", value).lower()
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        elif _DURATION.fullmatch(text.removeprefix("-").removeprefix("+")):
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text))
            seconds = -seconds if text.startswith("-") else seconds
        else:
            raise ValueError(f"invalid duration {value!r}: {_DURATION_HINT}")
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: must be a finite number of seconds")
    if seconds < 0:
        raise ValueError(f"invalid duration {value!r}: a duration cannot be negative")
    return seconds


def _invalid(kind: str, reason: str) -> PydanticCustomError:
    # A custom error keeps pydantic from prefixing the message with "Value error, "; the
    # reason goes through the context so braces in user input are not read as a template.
    return PydanticCustomError(kind, "{reason}", {"reason": reason})


def _coerce_duration(value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _invalid("duration", str(exc)) from exc


def _lowercase(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


Duration = Annotated[float, BeforeValidator(_coerce_duration)]
LogLevel = Literal["debug", "info", "warning", "error"]

# ---------------------------------------------------------------------------
# Models


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkerSettings(_Model):
    """How a worker claims and keeps executions (docs/workers.md)."""

    concurrency: int = Field(default=256, ge=1, le=10000)
    lease_ttl: Duration = Field(default=120.0, gt=0)
    # Declared after lease_ttl so its validator can compare against it.
    heartbeat_interval: Duration | None = Field(default=None, gt=0)
    poll_interval: Duration = Field(default=1.0, gt=0)
    shutdown_grace: Duration = Field(default=10.0, ge=0)
    # LISTEN/NOTIFY wake-ups (PostgreSQL); workers always poll too.
    notifications: bool = True
    # An idle worker offers to take the next submission directly (PostgreSQL, with
    # notifications; docs/workers.md, "Hand-off to an idle worker").
    handoff: bool = True
    # `veracity worker` serves its Prometheus metrics here when set (docs/operations.md)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = Field(default="127.0.0.1", min_length=1, max_length=255)

    @field_validator("heartbeat_interval")
    @classmethod
    def _heartbeat_below_ttl(cls, value: float | None, info: ValidationInfo) -> float | None:
        ttl = info.data.get("lease_ttl")  # absent when lease_ttl itself was invalid
        if value is not None and ttl is not None and value >= ttl:
            raise _invalid(
                "heartbeat_too_long",
                f"must be less than worker.lease_ttl ({ttl:g}s), or leases expire between beats",
            )
        return value

    @property
    def effective_heartbeat_interval(self) -> float:
        """The configured heartbeat interval, or a quarter of the lease TTL."""
        return self.heartbeat_interval or self.lease_ttl / 4


class ServerSettings(_Model):
    """How ``veracity server`` treats its HTTP connections (docs/operations.md)."""

    # A request whose headers and body have not all arrived this long after it began (or
    # after the connection opened) is cut off: slow clients cannot hold connections.
    read_timeout: Duration = Field(default=30.0, ge=1, le=3600)
    # Connections (and requests in flight) beyond this are answered 503 at once.
    max_connections: int = Field(default=1000, ge=1, le=100_000)


class RecoverySettings(_Model):
    """The service that recovers executions whose lease expired."""

    interval: Duration = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)


class ReconcilerSettings(_Model):
    """The external-execution reconciler (docs/external.md)."""

    interval: Duration = Field(default=120.0, gt=0)
    concurrency: int = Field(default=16, ge=1)
    engine_timeout: Duration = Field(default=10.0, gt=0)
    # A run past its limit, or asked to stop, whose stop the engine has not confirmed for
    # this long is flagged for an operator. At least a second, at most 30 days.
    stop_flag_after: Duration = Field(default=600.0, ge=1, le=30 * 86400)


MAX_RETENTION = 36_500 * 86400.0
"""``retention.terminal`` and ``veracity prune --older-than`` at most: 100 years."""


class RetentionSettings(_Model):
    """Retention: ended executions deleted with their history (docs/operations.md)."""

    # terminal executions that ended this long ago are deleted; 0 keeps everything; at
    # most MAX_RETENTION (a cutoff further back than that is no date)
    terminal: Duration = Field(default=30 * 86400.0, ge=0)
    # how often every server runs retention (one of them at a time)
    interval: Duration = Field(default=600.0, ge=1, le=86400)

    @field_validator("terminal")
    @classmethod
    def _within_dates(cls, value: float) -> float:
        if value > MAX_RETENTION:
            raise _invalid("retention_too_long", "at most 36500d (100 years)")
        return value

    @property
    def enabled(self) -> bool:
        return self.terminal > 0


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False  # a host name other than localhost may resolve to anything
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class AuthSettings(_Model):
    """API tokens on the HTTP API (docs/security.md)."""

    # None: required unless the server binds to a loopback address (Settings.auth_required)
    required: bool | None = None


class Settings(_Model):
    """Everything a Veracity process is configured with."""

    config_path: Path | None = None
    database_url: str = Field(default="sqlite:///./veracity.db", min_length=1)
    app: str | None = None
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8000, ge=1, le=65535)
    deployment_id: str | None = Field(default=None, min_length=1, max_length=128)
    max_payload_bytes: int = Field(default=1048576, ge=1024)
    log_level: Annotated[LogLevel, BeforeValidator(_lowercase)] = "info"
    # veracity/_heap.py: the youngest generation's threshold once a long-running process
    # has started; 0 leaves Python's (or the app's) thresholds as they are
    gc_young_threshold: int = Field(default=10_000, ge=0, le=10_000_000)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)
    reconciler: ReconcilerSettings = Field(default_factory=ReconcilerSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    public_url: str | None = None
    auth: AuthSettings = Field(default_factory=AuthSettings)
    # File-only tables, validated entry by entry at start (veracity.adapters.config.parse_external,
    # veracity.core.cron.parse_cron_entries): their errors name the entry at fault.
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)
    external_workflow: list[dict[str, Any]] = Field(default_factory=list)
    # Secret header bindings of ctx.http (docs/http.md): names of secrets, never values;
    # the values are read at the start of a server or worker (veracity.bindings).
    http: list[HttpBinding] = Field(default_factory=list)
    secrets_file: Path | None = None

    @field_validator("http")
    @classmethod
    def _bindings_unique(cls, value: list[HttpBinding]) -> list[HttpBinding]:
        check_bindings(value)
        return value
    cron: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("app")
    @classmethod
    def _app_shape(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
            raise _invalid(
                "app_shape",
                f"must be 'module:attribute' (e.g. 'myapp.workflows:app'), got {value!r}",
            )
        return value

    @property
    def auth_required(self) -> bool:
        """auth.required if set, else true unless ``host`` is a loopback address."""
        if self.auth.required is not None:
            return self.auth.required
        return not is_loopback(self.host)


# ---------------------------------------------------------------------------
# Documentation

_DEFAULT_TEXT = {
    "app": "none",
    "deployment_id": "digest of the workflow code",
    "worker.heartbeat_interval": "lease_ttl / 4",
    "public_url": "http://<host>:<port>",
    "secrets_file": "none",
    "auth.required": "true, unless host is a loopback address",
    "retention.terminal": "30d",
}
_DURATION_KEYS = {
    "worker.lease_ttl",
    "worker.poll_interval",
    "worker.shutdown_grace",
    "server.read_timeout",
    "recovery.interval",
    "reconciler.interval",
    "reconciler.engine_timeout",
    "reconciler.stop_flag_after",
    "retention.interval",
}


def describe() -> list[tuple[str, str, str]]:
    """(key, environment variable, default) for every setting, for docs and ``--help``."""
    defaults = Settings()
    rows = [("(the file itself: --config PATH)", CONFIG_ENV_VAR, "./veracity.toml if present")]
    for key, var in ENV_VARS.items():
        if key in _DEFAULT_TEXT:
            text = _DEFAULT_TEXT[key]
        else:
            value: Any = defaults
            for part in key.split("."):
                value = getattr(value, part)
            text = f"{value:g}s" if key in _DURATION_KEYS else str(value)
        rows.append((key, var, text))
    return rows


# ---------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class _ConfigFile:
    shown: str  # the path as the user gave it, for messages
    path: Path  # absolute
    named_by: str | None  # what named it, when it was named explicitly


def load_settings(
    config_path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Settings:
    """Merge defaults, the TOML file, ``VERACITY_*`` variables and CLI flags, in that order.

    ``overrides`` are CLI flags by dotted key (``"worker.concurrency"``); ``None`` means the
    flag was not given. Empty environment variables count as unset. Raises ``ConfigError``.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    config = _locate(config_path, environ)
    data: dict[str, Any] = {}
    text = ""
    if config is not None:
        data, text = _read(config)
    # Which flag or variable supplied a key; keys not in here came from the file.
    sources: dict[tuple[str, ...], str] = {}

    for key, var in ENV_VARS.items():
        raw = environ.get(var)
        if raw is not None and raw.strip() != "":
            sources.update(dict.fromkeys(_put(data, key, raw), var))
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        flag = "--" + key.rsplit(".", 1)[-1].replace("_", "-")
        if key == "config_path":
            raise ConfigError(f"{flag}: unknown key")
        sources.update(dict.fromkeys(_put(data, key, value), flag))

    data["config_path"] = config.path if config is not None else None
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(_message(first, config, text, sources)) from exc


def _locate(config_path: str | Path | None, environ: Mapping[str, str]) -> _ConfigFile | None:
    if config_path is not None:
        given, named_by = str(config_path), "--config"
    elif environ.get(CONFIG_ENV_VAR, "").strip():
        given, named_by = environ[CONFIG_ENV_VAR].strip(), CONFIG_ENV_VAR
    else:
        default = Path.cwd() / DEFAULT_CONFIG_FILE
        if default.is_file():
            return _ConfigFile(DEFAULT_CONFIG_FILE, default, None)
        return None
    path = Path(given).expanduser()
    if not path.exists():
        raise ConfigError(f"{given}: configuration file not found (named by {named_by})")
    return _ConfigFile(given, path.resolve(), named_by)


def _read(config: _ConfigFile) -> tuple[dict[str, Any], str]:
    try:
        text = config.path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{config.shown}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{config.shown}: not UTF-8 text (byte {exc.start})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = str(exc)
        match = re.search(r"\(at line (\d+), column \d+\)", reason)
        where = f"{config.shown}:{match.group(1)}" if match else config.shown
        raise ConfigError(f"{where}: {reason}") from exc
    if "config_path" in data:  # a real field, but set by the loader, never by the file
        line = _find_line(text, ("config_path",))
        where = f"{config.shown}:{line}" if line else config.shown
        raise ConfigError(f"{where}: config_path: unknown key")
    for key in data:
        # before any other error: the file asks for what is not here
        refusal = _NOT_SUPPORTED_REASON if key in NOT_SUPPORTED else ELSEWHERE.get(key)
        if refusal is not None:
            line = _find_line(text, (key,))
            where = f"{config.shown}:{line}" if line else config.shown
            raise ConfigError(f"{where}: {key}: {refusal}")
    return data, text


def _put(data: dict[str, Any], key: str, value: object) -> list[tuple[str, ...]]:
    """Set a dotted key; the paths now owned by this value (the key, and the shallowest
    table created for it). Empty when the file made a parent a non-table: that value is
    left for validation to report against the file."""
    *parents, last = key.split(".")
    owned: list[tuple[str, ...]] = []
    node = data
    for depth, part in enumerate(parents):
        if part not in node:
            node[part] = {}
            if not owned:
                owned.append(tuple(parents[: depth + 1]))
        child = node[part]
        if not isinstance(child, dict):
            return []
        node = child
    node[last] = value
    return [tuple(key.split(".")), *owned]


def _message(
    error: ErrorDetails,
    config: _ConfigFile | None,
    text: str,
    sources: Mapping[tuple[str, ...], str],
) -> str:
    loc = tuple(error["loc"])
    reason = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
    for n in range(len(loc), 0, -1):
        source = sources.get(tuple(str(p) for p in loc[:n]))
        if source is not None:
            return f"{source}: {reason}"
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    parts = [key, reason] if key else [reason]
    if config is not None:
        line = _find_line(text, loc)
        parts.insert(0, f"{config.shown}:{line}" if line else config.shown)
    return ": ".join(parts)


_KEY = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_ARRAY_HEADER = re.compile(rf"\s*\[\[\s*({_DOTTED})\s*\]\]\s*(?:#.*)?$")
_TABLE_HEADER = re.compile(rf"\s*\[\s*({_DOTTED})\s*\]\s*(?:#.*)?$")
_ASSIGNMENT = re.compile(rf"\s*({_DOTTED})\s*=")


def _split_key(dotted: str) -> tuple[str, ...]:
    parts = re.findall(_KEY, dotted)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def _find_line(text: str, loc: tuple[str | int, ...]) -> int | None:
    """The line defining ``loc`` (or its nearest enclosing table) in TOML text; best effort.

    Handles ``[table]`` headers, dotted keys and ``[[arrays]]`` of tables; inline tables and
    multi-line values resolve to the line of the enclosing key.
    """
    lines: dict[tuple[str | int, ...], int] = {}
    array_counts: dict[tuple[str, ...], int] = {}
    table: tuple[str | int, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        path: tuple[str | int, ...]
        if match := _ARRAY_HEADER.match(line):
            name = _split_key(match.group(1))
            index = array_counts.get(name, -1) + 1
            array_counts[name] = index
            table = path = (*name, index)
        elif match := _TABLE_HEADER.match(line):
            table = path = _split_key(match.group(1))
        elif match := _ASSIGNMENT.match(line):
            path = (*table, *_split_key(match.group(1)))
        else:
            continue
        for n in range(1, len(path) + 1):
            lines.setdefault(path[:n], number)
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None
