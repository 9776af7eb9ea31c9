"""Secret header bindings for a step's outbound HTTP (docs/http.md).

An ``[[http]]`` entry of ``veracity.toml`` allows one origin (scheme, host, port) and the
methods a step may use there, and names the headers Veracity adds to each request to it;
a header's value may name secrets (``${secret:NAME}``), never hold them::

    [[http]]
    name = "control_plane"
    origin = "http://127.0.0.1:8000"
    methods = ["GET", "PUT"]
    headers = { Authorization = "Bearer ${secret:control_token}" }

:class:`HttpBinding` validates an entry as the configuration is loaded (every command);
:func:`resolve_http` reads the secrets they name, at the start of a server or a worker, from
``VERACITY_SECRET_<NAME>`` or the ``secrets_file``. The values live only in the
:class:`Bindings` it returns and in this module's redaction registry: every text a process
writes (step results and errors, params of the executions a workflow starts, workflow
results and errors, log lines) passes through :func:`redact_text` or :func:`redact_json`,
so a value that reached such a text by any path (an API echoing the header into an error
message, say) is replaced before it is stored.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticCustomError, core_schema

from veracity._validated import Validated, setting
from veracity.errors import ConfigError

if TYPE_CHECKING:
    from veracity.config import Settings

__all__ = [
    "METHODS",
    "MIN_SECRET_LENGTH",
    "SECRET_ENV_PREFIX",
    "Binding",
    "Bindings",
    "HttpBinding",
    "load_secrets_file",
    "redact_json",
    "redact_text",
    "resolve_http",
    "secret_env_var",
]

SECRET_ENV_PREFIX = "VERACITY_SECRET_"
METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
"""The methods a binding may allow. TRACE (which echoes the request, headers included, back)
and CONNECT (a tunnel to anywhere) are not among them."""
MIN_SECRET_LENGTH = 8
"""Shorter values are refused: redaction replaces every occurrence of a value in what is
stored, which for a value of a few characters would mangle unrelated text."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_SECRET_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
_REFERENCE = re.compile(r"\$\{secret:(" + _SECRET_NAME + r")\}")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Printable ASCII (space included): what a header value can carry without encoding
# questions. A value outside it would be refused by the HTTP library, whose message may
# quote the value, so it is refused here first, without quoting it.
_HEADER_TEXT = re.compile(r"[\x20-\x7e]*")
_FRAMING = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
    "te", "trailer", "proxy-connection",
})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?")
_IPV6 = re.compile(r"[0-9a-f:.]+")


def _invalid(kind: str, reason: str) -> PydanticCustomError:
    # as in veracity.config: no "Value error, " prefix, and braces in input stay literal
    return PydanticCustomError(kind, "{reason}", {"reason": reason})


def secret_env_var(name: str) -> str:
    """The environment variable holding secret ``name``: ``VERACITY_SECRET_<NAME>``."""
    return SECRET_ENV_PREFIX + name.upper()


def references(template: str) -> list[str]:
    """The secret names a header value names, in order (lower case: names are not
    case-sensitive, as their variables are upper case)."""
    return [m.group(1).lower() for m in _REFERENCE.finditer(template)]


# ---------------------------------------------------------------------------
# Configuration: one [[http]] entry


def _binding_name(value: Any) -> Any:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise _invalid("binding_name", "a binding's name is 1 to 64 letters, digits, "
                       f"'_' or '-' (starting with a letter or digit), got {value!r}")
    return value


def _binding_origin(value: Any) -> str:
    if not isinstance(value, str):
        raise _invalid("origin", f"expected an origin such as 'https://api.example.com' "
                       f"or 'http://127.0.0.1:8000', got {value!r}")
    scheme, host, port = parse_origin(value)
    return f"{scheme}://{_bracketed(host)}:{port}"


def _binding_methods(value: Any) -> tuple[str, ...]:
    if (not isinstance(value, list | tuple) or not value
            or not all(isinstance(m, str) for m in value)):
        raise _invalid("methods", "expected a non-empty list of HTTP methods, such as "
                       f"[\"GET\", \"PUT\"], got {value!r}")
    seen: list[str] = []
    for method in value:
        upper = method.strip().upper()
        if upper not in METHODS:
            raise _invalid("method", f"unknown method {method!r}: a binding may allow "
                           f"{', '.join(METHODS)}")
        if upper not in seen:
            seen.append(upper)
    return tuple(seen)


def _binding_headers(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _invalid("headers", "expected a table of header names to values, such as "
                       '{ Authorization = "Bearer ${secret:api_token}" }')
    out: dict[str, str] = {}
    lowered: dict[str, str] = {}
    for name, template in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise _invalid("header_name", f"{name!r} is not a header name")
        if name.lower() in _FRAMING:
            raise _invalid("header_name", f"{name}: a header the HTTP client sets itself; "
                           "a binding cannot set it")
        if name.lower() in lowered:
            raise _invalid("header_name", f"{name}: given twice (also as "
                           f"{lowered[name.lower()]}; header names ignore case)")
        lowered[name.lower()] = name
        if not isinstance(template, str):
            raise _invalid("header_value", f"{name}: expected a string, got {template!r}")
        literal = _REFERENCE.sub("", template)
        if "${" in literal:
            raise _invalid("header_value", f"{name}: a malformed secret reference: write "
                           "${secret:NAME}, NAME being letters, digits and '_'")
        if not _HEADER_TEXT.fullmatch(literal):
            raise _invalid("header_value", f"{name}: only printable ASCII characters may "
                           "be written in a header's value")
        out[name] = template
    return out


def _before(check: Any, schema: core_schema.CoreSchema) -> core_schema.CoreSchema:
    return core_schema.no_info_before_validator_function(check, schema)


class HttpBinding(Validated):
    """One ``[[http]]`` entry as configured: nothing secret in it, only the names."""

    name: str = setting(_before(_binding_name, core_schema.str_schema()))
    origin: str = setting(_before(_binding_origin, core_schema.str_schema()))
    """Normalised: ``scheme://host:port``, the port always written."""
    methods: tuple[str, ...] = setting(_before(
        _binding_methods, core_schema.tuple_variable_schema(core_schema.str_schema())))
    """Upper case, in the order given, without repeats."""
    headers: dict[str, str] = setting(_before(_binding_headers, core_schema.dict_schema(
        core_schema.str_schema(), core_schema.str_schema())), factory=dict)

    @property
    def secrets(self) -> list[str]:
        """The secret names its headers name, each once, in order."""
        names: list[str] = []
        for template in self.headers.values():
            names.extend(n for n in references(template) if n not in names)
        return names


def parse_origin(text: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an origin such as ``https://api.example.com`` (host in
    lower case, IDNA-encoded; port made explicit). Raises ``PydanticCustomError``."""
    import httpx  # loaded only when a configuration has [[http]] entries

    shown = text
    text = text.strip()
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, ValueError) as exc:
        raise _invalid("origin", f"invalid origin {shown!r}: {exc}") from None
    if url.scheme not in _DEFAULT_PORTS:
        raise _invalid("origin", f"invalid origin {shown!r}: the scheme must be http or https")
    if not url.raw_host:
        raise _invalid("origin", f"invalid origin {shown!r}: no host")
    if url.userinfo:
        raise _invalid("origin", f"invalid origin {shown!r}: no user or password in an origin "
                       "(credentials go in headers, through secrets)")
    if url.raw_path not in (b"", b"/") or url.query or url.fragment:
        raise _invalid("origin", f"invalid origin {shown!r}: an origin is scheme, host and "
                       "port only, without a path, query or fragment")
    host = url.raw_host.decode("ascii").lower()
    if not (_HOST.fullmatch(host) or (":" in host and _IPV6.fullmatch(host))):
        raise _invalid("origin", f"invalid origin {shown!r}: {url.host!r} is not a host name "
                       "or IP address")
    port = url.port if url.port is not None else _DEFAULT_PORTS[url.scheme]
    if not 1 <= port <= 65535:
        raise _invalid("origin", f"invalid origin {shown!r}: the port must be 1 to 65535")
    return url.scheme, host, port


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def check_bindings(bindings: Sequence[HttpBinding]) -> Sequence[HttpBinding]:
    """Across entries: names and origins are unique (a request's origin picks its binding)."""
    names: dict[str, int] = {}
    origins: dict[str, int] = {}
    for i, b in enumerate(bindings):
        if b.name in names:
            raise _invalid("binding_twice", f"the binding name {b.name!r} is used twice "
                           f"(http[{names[b.name]}] and http[{i}])")
        if b.origin in origins:
            raise _invalid("origin_twice", f"the origin {b.origin} is bound twice "
                           f"(http[{origins[b.origin]}] and http[{i}]): a request's origin "
                           "picks its binding, so one binding per origin")
        names[b.name] = i
        origins[b.origin] = i
    return bindings


# ---------------------------------------------------------------------------
# Redaction: every secret value this process has read


_known: dict[str, str] = {}
"""value -> secret name, for every secret this process resolved."""
_by_length: list[tuple[str, str]] = []


def _register(name: str, value: str) -> None:
    global _by_length
    _known[value] = name
    # longest first: a value containing another is replaced whole
    _by_length = sorted(_known.items(), key=lambda kv: -len(kv[0]))


def redaction_of(name: str) -> str:
    """What stands in place of secret ``name``'s value wherever it would be written."""
    return f"[secret {name}]"


def redact_text(text: str) -> str:
    """``text`` with every known secret value replaced by :func:`redaction_of` its name."""
    for value, name in _by_length:
        if value in text:
            text = text.replace(value, redaction_of(name))
    return text


def redact_json(value: Any) -> Any:
    """A JSON value (str, number, bool, None, list, dict) with :func:`redact_text` applied
    to every string in it, keys included. The same object when nothing is known."""
    if not _by_length:
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, dict):
        return {redact_text(k) if isinstance(k, str) else k: redact_json(v)
                for k, v in value.items()}
    return value


def secrets_known() -> bool:
    """Whether this process has read any secret value."""
    return bool(_by_length)


def holds_secret(text: str) -> bool:
    return any(value in text for value, _ in _by_length)


# ---------------------------------------------------------------------------
# Resolution at start


@dataclass(frozen=True, slots=True)
class Binding:
    """A binding with its secrets read: what the HTTP client of a step enforces."""

    name: str
    scheme: str
    host: str
    port: int
    methods: tuple[str, ...]
    templates: dict[str, str]
    """The configured header values (secret names, no values): safe to show."""
    _headers: tuple[tuple[str, str], ...] = field(repr=False, compare=False)

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{_bracketed(self.host)}:{self.port}"

    def describe(self) -> str:
        """``name (origin: METHODS)``: for messages and logs."""
        return f"{self.name} ({self.origin}: {', '.join(self.methods)})"

    def headers(self) -> Iterator[tuple[str, str]]:
        """The headers to send, secrets filled in. Never log or store them."""
        return iter(self._headers)


@dataclass(frozen=True, slots=True)
class Bindings:
    """The resolved ``[[http]]`` entries of this process."""

    items: tuple[Binding, ...] = ()

    def for_origin(self, scheme: str, host: str, port: int) -> Binding | None:
        for b in self.items:
            if (b.scheme, b.host, b.port) == (scheme, host, port):
                return b
        return None

    def describe(self) -> list[str]:
        return [b.describe() for b in self.items]


def load_secrets_file(path: Path) -> dict[str, str]:
    """Secret name (lower case) -> value, from a TOML file of ``NAME = "value"`` lines.

    Refused, naming the file, if it is missing, not a regular file, or open to its group or
    to others (``mode & 0o077``). No message ever quotes a value."""
    shown = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"secrets_file {shown}: not found") from None
    except OSError as exc:
        raise ConfigError(f"secrets_file {shown}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"secrets_file {shown}: not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"secrets_file {shown}: readable or writable by others than its owner "
            f"(mode {mode:04o}); make it private: chmod 600 {shown}")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"secrets_file {shown}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"secrets_file {shown}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's messages give a position, never the text at it
        raise ConfigError(f"secrets_file {shown}: {exc}") from None
    values: dict[str, str] = {}
    for key, value in data.items():
        if not re.fullmatch(_SECRET_NAME, key):
            raise ConfigError(f"secrets_file {shown}: {key!r} is not a secret name (letters, "
                              "digits and '_', not starting with a digit)")
        if not isinstance(value, str):
            raise ConfigError(f"secrets_file {shown}: {key}: expected {key} = \"value\" "
                              f"(a string), got a {type(value).__name__}")
        if key.lower() in values:
            raise ConfigError(f"secrets_file {shown}: {key}: defined twice (secret names "
                              "ignore case)")
        values[key.lower()] = value
    return values


def _fill(template: str, values: Mapping[str, str]) -> str:
    return _REFERENCE.sub(lambda m: values[m.group(1).lower()], template)


def resolve_http(settings: Settings, environ: Mapping[str, str] | None = None) -> Bindings:
    """Read the secrets the ``[[http]]`` entries name; the bindings ready to use.

    A secret comes from ``VERACITY_SECRET_<NAME>`` (set and not blank), else from the
    ``secrets_file``. Raises :class:`ConfigError` naming the binding whose secret is not
    defined, or the secret whose value cannot be sent; never quoting a value."""
    environ = os.environ if environ is None else environ
    from_file = load_secrets_file(settings.secrets_file) if settings.secrets_file else {}
    items: list[Binding] = []
    for entry in settings.http:
        values: dict[str, str] = {}
        for name in entry.secrets:
            var = secret_env_var(name)
            raw = environ.get(var)
            source = var
            if raw is None or not raw.strip():
                raw = from_file.get(name)
                source = f"secrets_file {settings.secrets_file}"
            if raw is None:
                where = (f"add {name} = \"...\" to secrets_file {settings.secrets_file}"
                         if settings.secrets_file else "name a secrets_file that defines it")
                raise ConfigError(f"http binding {entry.name}: secret {name} is not defined: "
                                  f"set {var} or {where}")
            value = raw.strip()
            if len(value) < MIN_SECRET_LENGTH:
                raise ConfigError(f"http binding {entry.name}: secret {name} (from {source}) "
                                  f"is shorter than {MIN_SECRET_LENGTH} characters")
            if not _HEADER_TEXT.fullmatch(value):
                raise ConfigError(f"http binding {entry.name}: secret {name} (from {source}) "
                                  "has characters a header cannot carry (only printable "
                                  "ASCII)")
            values[name] = value
        headers = tuple((header, _fill(template, values))
                        for header, template in entry.headers.items())
        scheme, host, port = parse_origin(entry.origin)
        items.append(Binding(entry.name, scheme, host, port, entry.methods,
                             dict(entry.headers), headers))
        for name, value in values.items():
            _register(name, value)
    return Bindings(tuple(items))
