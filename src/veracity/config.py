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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_core import ErrorDetails, PydanticCustomError, ValidationError, core_schema

from veracity._validated import Validated, setting
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


# Schemas (pydantic-core's, veracity/_validated.py): what each field takes


def _int(*, ge: int | None = None, le: int | None = None) -> core_schema.CoreSchema:
    return core_schema.int_schema(ge=ge, le=le)


def _duration(*, gt: float | None = None, ge: float | None = None,
              le: float | None = None) -> core_schema.CoreSchema:
    """Seconds: a number, or a duration string (``parse_duration``)."""
    return core_schema.no_info_before_validator_function(
        _coerce_duration, core_schema.float_schema(gt=gt, ge=ge, le=le))


def _str(*, min_length: int | None = None, max_length: int | None = None
         ) -> core_schema.CoreSchema:
    return core_schema.str_schema(min_length=min_length, max_length=max_length)


_PATH = core_schema.union_schema(
    [core_schema.is_instance_schema(Path),
     core_schema.no_info_after_validator_function(Path, core_schema.str_schema(strict=True))],
    custom_error_type="path_type",
    custom_error_message="Input is not a valid path for <class 'pathlib.Path'>",
)
_BOOL = core_schema.bool_schema()
_TABLE = core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema())
"""A TOML table whose entries are checked later, by what reads them."""


def _optional(schema: core_schema.CoreSchema) -> core_schema.CoreSchema:
    return core_schema.nullable_schema(schema)


def _after(check: Callable[[Any], Any], schema: core_schema.CoreSchema
           ) -> core_schema.CoreSchema:
    return core_schema.no_info_after_validator_function(check, schema)


# ---------------------------------------------------------------------------
# Models


def _heartbeat_below_ttl(value: float | None, info: core_schema.ValidationInfo
                         ) -> float | None:
    ttl = info.data.get("lease_ttl")  # absent when lease_ttl itself was invalid
    if value is not None and ttl is not None and value >= ttl:
        raise _invalid(
            "heartbeat_too_long",
            f"must be less than worker.lease_ttl ({ttl:g}s), or leases expire between beats",
        )
    return value


class WorkerSettings(Validated):
    """How a worker claims and keeps executions (docs/workers.md)."""

    concurrency: int = setting(_int(ge=1, le=10000), default=256)
    lease_ttl: float = setting(_duration(gt=0), default=120.0)
    # Declared after lease_ttl so its validator can compare against it.
    heartbeat_interval: float | None = setting(
        core_schema.with_info_after_validator_function(
            _heartbeat_below_ttl, _optional(_duration(gt=0))),
        default=None)
    poll_interval: float = setting(_duration(gt=0), default=1.0)
    shutdown_grace: float = setting(_duration(ge=0), default=10.0)
    # LISTEN/NOTIFY wake-ups (PostgreSQL); workers always poll too.
    notifications: bool = setting(_BOOL, default=True)
    # An idle worker offers to take the next submission directly (PostgreSQL, with
    # notifications; docs/workers.md, "Hand-off to an idle worker").
    handoff: bool = setting(_BOOL, default=True)
    # `veracity worker` serves its Prometheus metrics here when set (docs/operations.md)
    metrics_port: int | None = setting(_optional(_int(ge=1, le=65535)), default=None)
    metrics_host: str = setting(_str(min_length=1, max_length=255), default="127.0.0.1")

    @property
    def effective_heartbeat_interval(self) -> float:
        """The configured heartbeat interval, or a quarter of the lease TTL."""
        return self.heartbeat_interval or self.lease_ttl / 4


class ServerSettings(Validated):
    """How ``veracity server`` treats its HTTP connections (docs/operations.md)."""

    # A request whose headers and body have not all arrived this long after it began (or
    # after the connection opened) is cut off: slow clients cannot hold connections.
    read_timeout: float = setting(_duration(ge=1, le=3600), default=30.0)
    # Connections (and requests in flight) beyond this are answered 503 at once.
    max_connections: int = setting(_int(ge=1, le=100_000), default=1000)


class RecoverySettings(Validated):
    """The service that recovers executions whose lease expired."""

    interval: float = setting(_duration(gt=0), default=30.0)
    max_attempts: int = setting(_int(ge=1), default=5)


class ReconcilerSettings(Validated):
    """The external-execution reconciler (docs/external.md)."""

    interval: float = setting(_duration(gt=0), default=120.0)
    concurrency: int = setting(_int(ge=1), default=16)
    engine_timeout: float = setting(_duration(gt=0), default=10.0)
    # A run past its limit, or asked to stop, whose stop the engine has not confirmed for
    # this long is flagged for an operator. At least a second, at most 30 days.
    stop_flag_after: float = setting(_duration(ge=1, le=30 * 86400), default=600.0)


MAX_RETENTION = 36_500 * 86400.0
"""``retention.terminal`` and ``veracity prune --older-than`` at most: 100 years."""


def _within_dates(value: float) -> float:
    if value > MAX_RETENTION:
        raise _invalid("retention_too_long", "at most 36500d (100 years)")
    return value


class RetentionSettings(Validated):
    """Retention: ended executions deleted with their history (docs/operations.md)."""

    # terminal executions that ended this long ago are deleted; 0 keeps everything; at
    # most MAX_RETENTION (a cutoff further back than that is no date)
    terminal: float = setting(_after(_within_dates, _duration(ge=0)), default=30 * 86400.0)
    # how often every server runs retention (one of them at a time)
    interval: float = setting(_duration(ge=1, le=86400), default=600.0)

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


class AuthSettings(Validated):
    """API tokens on the HTTP API (docs/security.md)."""

    # None: required unless the server binds to a loopback address (Settings.auth_required)
    required: bool | None = setting(_optional(_BOOL), default=None)


def _app_shape(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
        raise _invalid(
            "app_shape",
            f"must be 'module:attribute' (e.g. 'myapp.workflows:app'), got {value!r}",
        )
    return value


def _bindings_unique(value: list[HttpBinding]) -> list[HttpBinding]:
    check_bindings(value)
    return value


def _nested(cls: type[Validated]) -> Any:
    """A table of settings, its own defaults when absent."""
    return setting(cls.__core_schema__, factory=cls)


class Settings(Validated):
    """Everything a Veracity process is configured with."""

    config_path: Path | None = setting(_optional(_PATH), default=None)
    database_url: str = setting(_str(min_length=1), default="sqlite:///./veracity.db")
    app: str | None = setting(_after(_app_shape, _optional(_str())), default=None)
    host: str = setting(_str(min_length=1), default="127.0.0.1")
    port: int = setting(_int(ge=1, le=65535), default=8000)
    deployment_id: str | None = setting(_optional(_str(min_length=1, max_length=128)),
                                        default=None)
    max_payload_bytes: int = setting(_int(ge=1024), default=1048576)
    log_level: str = setting(core_schema.no_info_before_validator_function(
        _lowercase, core_schema.literal_schema(["debug", "info", "warning", "error"])),
        default="info")
    # veracity/_heap.py: the youngest generation's threshold once a long-running process
    # has started; 0 leaves Python's (or the app's) thresholds as they are
    gc_young_threshold: int = setting(_int(ge=0, le=10_000_000), default=10_000)
    worker: WorkerSettings = _nested(WorkerSettings)
    server: ServerSettings = _nested(ServerSettings)
    recovery: RecoverySettings = _nested(RecoverySettings)
    reconciler: ReconcilerSettings = _nested(ReconcilerSettings)
    retention: RetentionSettings = _nested(RetentionSettings)
    public_url: str | None = setting(_optional(_str()), default=None)
    auth: AuthSettings = _nested(AuthSettings)
    # File-only tables, validated entry by entry at start (veracity.adapters.config.parse_external,
    # veracity.core.cron.parse_cron_entries): their errors name the entry at fault.
    engines: dict[str, dict[str, Any]] = setting(
        core_schema.dict_schema(core_schema.str_schema(), _TABLE), factory=dict)
    external_workflow: list[dict[str, Any]] = setting(core_schema.list_schema(_TABLE),
                                                      factory=list)
    # Secret header bindings of ctx.http (docs/http.md): names of secrets, never values;
    # the values are read at the start of a server or worker (veracity.bindings).
    http: list[HttpBinding] = setting(
        _after(_bindings_unique, core_schema.list_schema(HttpBinding.__core_schema__)),
        factory=list)
    secrets_file: Path | None = setting(_optional(_PATH), default=None)
    cron: list[dict[str, Any]] = setting(core_schema.list_schema(_TABLE), factory=list)

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
