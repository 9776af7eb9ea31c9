"""``[[http]]`` bindings and their secrets: validation as the configuration loads, and the
resolution of ``${secret:NAME}`` at start (docs/http.md). Every refusal names what is wrong
and where, and never quotes a secret's value."""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from pathlib import Path

import pytest

from veracity._logging import JsonFormatter
from veracity.bindings import (
    Bindings,
    load_secrets_file,
    redact_json,
    redact_text,
    resolve_http,
)
from veracity.config import Settings, load_settings
from veracity.errors import ConfigError

GOOD = '''\
port = 9000

[[http]]
name = "control_plane"
origin = "http://127.0.0.1:8000"
methods = ["GET", "PUT"]
headers = { Authorization = "Bearer ${secret:control_token}" }
'''


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)
    return path


def config_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    return str(info.value)


def start_error(settings: Settings, env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_http(settings, env)
    return str(info.value)


def secret() -> str:
    return f"tok-{uuid.uuid4().hex}"


# --- the shape of an entry ---------------------------------------------------------------


def test_a_binding_as_the_docs_write_it(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path / "v.toml", GOOD), env={})
    [b] = s.http
    assert (b.name, b.origin, b.methods) == ("control_plane", "http://127.0.0.1:8000",
                                             ("GET", "PUT"))
    assert b.headers == {"Authorization": "Bearer ${secret:control_token}"}
    assert b.secrets == ["control_token"]


def test_origins_and_methods_are_normalised(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path / "v.toml", '''
[[http]]
name = "a"
origin = "HTTPS://API.Example.com/"
methods = ["get", "Post", "GET"]
[[http]]
name = "b"
origin = "http://[::1]:8080"
methods = ["DELETE"]
'''), env={})
    assert [(b.origin, b.methods) for b in s.http] == [
        ("https://api.example.com:443", ("GET", "POST")),
        ("http://[::1]:8080", ("DELETE",)),
    ]
    assert s.http[0].headers == {}


@pytest.mark.parametrize(("entry", "key", "reason"), [
    ('origin = "ftp://127.0.0.1"', "origin", "the scheme must be http or https"),
    ('origin = "127.0.0.1:8000"', "origin", "the scheme must be http or https"),
    ('origin = "http://127.0.0.1:8000/v1"', "origin", "without a path, query or fragment"),
    ('origin = "http://127.0.0.1:8000?a=1"', "origin", "without a path, query or fragment"),
    ('origin = "http://u:p@127.0.0.1:8000"', "origin", "no user or password in an origin"),
    ('origin = "http://127.0.0.1:99999"', "origin", "the port must be 1 to 65535"),
    ('origin = "http://127.0.0.1:0"', "origin", "the port must be 1 to 65535"),
    ('origin = "http://a b:80"', "origin", "is not a host name or IP address"),
    ('origin = "http://"', "origin", "invalid origin"),
    ("origin = 8000", "origin", "expected an origin"),
    ('methods = ["GET", "FETCH"]', "methods", "unknown method 'FETCH'"),
    ('methods = ["TRACE"]', "methods", "unknown method 'TRACE'"),
    ("methods = []", "methods", "non-empty list"),
    ('methods = "GET"', "methods", "non-empty list"),
    ('headers = { "Bad Name" = "x" }', "headers", "'Bad Name' is not a header name"),
    ('headers = { Host = "evil" }', "headers", "Host: a header the HTTP client sets"),
    ('headers = { Authorization = "Bearer ${secret:}" }', "headers",
     "malformed secret reference"),
    ('headers = { Authorization = "Bearer ${secrets:x}" }', "headers",
     "malformed secret reference"),
    ('headers = { Authorization = "Bearer ${secret:a-b}" }', "headers",
     "malformed secret reference"),
    ('headers = { X = "caf\u00e9" }', "headers", "only printable ASCII"),
    ('headers = { X = 1 }', "headers", "X: expected a string"),
    ('headers = { X-Key = "a", x-key = "b" }', "headers", "given twice"),
    ('name = "has space"', "name", "a binding's name is"),
    ('token = "${secret:x}"', "token", "unknown key"),
])
def test_a_malformed_binding_is_refused_naming_file_line_and_key(
    tmp_path: Path, entry: str, key: str, reason: str
) -> None:
    fields = {"name": 'name = "api"', "origin": 'origin = "http://127.0.0.1:8000"',
              "methods": 'methods = ["GET"]'}
    fields[entry.split(" =")[0]] = entry  # replaces one of them, or adds a key
    lines = "\n".join(fields.values())
    path = write(tmp_path / "v.toml", f'port = 9000\n\n[[http]]\n{lines}\n')
    message = config_error(path)
    assert message.startswith(f"{path}:"), message
    assert f"http[0].{key}: " in message, message
    assert reason in message, message
    line = int(message.split(":")[1])
    assert path.read_text().splitlines()[line - 1].startswith(key), (line, message)


@pytest.mark.parametrize(("second", "reason"), [
    ('name = "api"\norigin = "http://127.0.0.1:9000"',
     "the binding name 'api' is used twice (http[0] and http[1])"),
    ('name = "other"\norigin = "http://127.0.0.1:8000/"',
     "the origin http://127.0.0.1:8000 is bound twice (http[0] and http[1]): a request's "
     "origin picks its binding, so one binding per origin"),
])
def test_names_and_origins_are_unique(tmp_path: Path, second: str, reason: str) -> None:
    path = write(tmp_path / "v.toml", '[[http]]\nname = "api"\norigin = "http://127.0.0.1:8000"'
                 f'\nmethods = ["GET"]\n[[http]]\n{second}\nmethods = ["GET"]\n')
    assert config_error(path) == f"{path}:1: http: {reason}"


def test_a_secrets_table_in_the_config_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "v.toml", 'port = 9000\n[secrets]\ncontrol_token = "abcdefgh"\n')
    message = config_error(path)
    assert message.startswith(f"{path}:2: secrets: secret values never sit in veracity.toml")
    assert "abcdefgh" not in message


def test_secrets_file_from_file_env_and_flag(tmp_path: Path) -> None:
    path = write(tmp_path / "v.toml", 'secrets_file = "/etc/veracity/secrets.toml"\n')
    assert load_settings(path, env={}).secrets_file == Path("/etc/veracity/secrets.toml")
    env = {"VERACITY_SECRETS_FILE": "/run/secrets.toml"}
    assert load_settings(path, env=env).secrets_file == Path("/run/secrets.toml")
    flagged = load_settings(path, env=env, overrides={"secrets_file": "s.toml"})
    assert flagged.secrets_file == Path("s.toml")
    assert load_settings(env={}).secrets_file is None


# --- secrets at start ----------------------------------------------------------------------


def settings_of(tmp_path: Path, text: str = GOOD) -> Settings:
    return load_settings(write(tmp_path / "v.toml", text), env={})


def test_a_secret_from_the_environment(tmp_path: Path) -> None:
    value = secret()
    bindings = resolve_http(settings_of(tmp_path), {"VERACITY_SECRET_CONTROL_TOKEN": value})
    [b] = bindings.items
    assert list(b.headers()) == [("Authorization", f"Bearer {value}")]
    assert (b.scheme, b.host, b.port, b.methods) == ("http", "127.0.0.1", 8000, ("GET", "PUT"))
    # whatever shows a binding shows names, never the value
    for text in (repr(bindings), str(b), b.describe(), repr(b.templates)):
        assert value not in text, text
    assert b.describe() == "control_plane (http://127.0.0.1:8000: GET, PUT)"


def test_a_secret_from_the_secrets_file_and_the_environment_first(tmp_path: Path) -> None:
    in_file, in_env = secret(), secret()
    secrets = write(tmp_path / "secrets.toml", f'CONTROL_TOKEN = "{in_file}"\nunused = "x"\n')
    s = settings_of(tmp_path, f'secrets_file = "{secrets}"\n' + GOOD)
    [b] = resolve_http(s, {}).items
    assert list(b.headers()) == [("Authorization", f"Bearer {in_file}")]
    # the variable, when set and not blank, wins over the file
    [b] = resolve_http(s, {"VERACITY_SECRET_CONTROL_TOKEN": f"  {in_env}\n"}).items
    assert list(b.headers()) == [("Authorization", f"Bearer {in_env}")]
    [b] = resolve_http(s, {"VERACITY_SECRET_CONTROL_TOKEN": "  "}).items
    assert list(b.headers()) == [("Authorization", f"Bearer {in_file}")]
    assert repr(s).count(in_file) == 0 and in_env not in repr(s)


def test_a_secret_referenced_but_not_defined_stops_the_start_naming_the_binding(
    tmp_path: Path,
) -> None:
    s = settings_of(tmp_path)
    assert start_error(s, {}) == (
        "http binding control_plane: secret control_token is not defined: set "
        "VERACITY_SECRET_CONTROL_TOKEN or name a secrets_file that defines it")
    secrets = write(tmp_path / "secrets.toml", 'other = "0123456789"\n')
    s = settings_of(tmp_path, f'secrets_file = "{secrets}"\n' + GOOD)
    assert start_error(s, {"VERACITY_SECRET_OTHER": "0123456789"}) == (
        "http binding control_plane: secret control_token is not defined: set "
        f"VERACITY_SECRET_CONTROL_TOKEN or add control_token = \"...\" to secrets_file "
        f"{secrets}")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660, 0o700 | 0o001])
def test_a_secrets_file_open_to_others_is_refused_naming_file_and_mode(
    tmp_path: Path, mode: int
) -> None:
    value = secret()
    secrets = write(tmp_path / "secrets.toml", f'control_token = "{value}"\n', mode)
    s = settings_of(tmp_path, f'secrets_file = "{secrets}"\n' + GOOD)
    message = start_error(s, {})
    assert message == (f"secrets_file {secrets}: readable or writable by others than its "
                       f"owner (mode {mode:04o}); make it private: chmod 600 {secrets}")
    assert value not in message
    # refused whether or not a binding needs it, and whatever the environment holds
    assert start_error(s, {"VERACITY_SECRET_CONTROL_TOKEN": secret()}) == message


@pytest.mark.parametrize(("text", "reason"), [
    ("control_token = 12345678\n", "control_token: expected control_token = \"value\" "
                                   "(a string), got a int"),
    ('control_token = "x"\nCONTROL_TOKEN = "y"\n', "CONTROL_TOKEN: defined twice"),
    ('"bad name" = "0123456789"\n', "'bad name' is not a secret name"),
    ("control_token = \n", "(at line 1, column 17)"),
])
def test_a_malformed_secrets_file_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    secrets = write(tmp_path / "secrets.toml", text)
    s = settings_of(tmp_path, f'secrets_file = "{secrets}"\n' + GOOD)
    message = start_error(s, {})
    assert message.startswith(f"secrets_file {secrets}: "), message
    assert reason in message, message


def test_a_missing_secrets_file_is_refused(tmp_path: Path) -> None:
    s = settings_of(tmp_path, f'secrets_file = "{tmp_path}/none.toml"\n' + GOOD)
    assert start_error(s, {}) == f"secrets_file {tmp_path}/none.toml: not found"
    s = settings_of(tmp_path, f'secrets_file = "{tmp_path}"\n' + GOOD)
    assert start_error(s, {}) == f"secrets_file {tmp_path}: not a regular file"
    assert load_secrets_file(write(tmp_path / "ok.toml", "")) == {}


@pytest.mark.parametrize(("value", "reason"), [
    ("q7z-k2", "is shorter than 8 characters"),
    ("caf\u00e9-caf\u00e9-token", "has characters a header cannot carry"),
    ("line-one\r\nX-Evil: 1", "has characters a header cannot carry"),
])
def test_a_secret_a_header_cannot_carry_is_refused_without_quoting_it(
    tmp_path: Path, value: str, reason: str
) -> None:
    message = start_error(settings_of(tmp_path), {"VERACITY_SECRET_CONTROL_TOKEN": value})
    assert message.startswith("http binding control_plane: secret control_token (from "
                              "VERACITY_SECRET_CONTROL_TOKEN) "), message
    assert reason in message
    assert value not in message


def test_no_bindings_no_secrets_needed(tmp_path: Path) -> None:
    assert resolve_http(settings_of(tmp_path, "port = 9000\n"), {}) == Bindings(())


# --- redaction -----------------------------------------------------------------------------


def test_resolved_values_are_redacted_from_text_and_json(tmp_path: Path) -> None:
    value = secret()
    resolve_http(settings_of(tmp_path), {"VERACITY_SECRET_CONTROL_TOKEN": value})
    assert redact_text(f"upstream said: Bearer {value}!") == (
        "upstream said: Bearer [secret control_token]!")
    assert redact_json({"a": [value, 1, None, {value: f"x{value}"}]}) == {
        "a": ["[secret control_token]", 1, None,
              {"[secret control_token]": "x[secret control_token]"}]}
    assert redact_text("nothing here") == "nothing here"


def test_log_lines_never_carry_a_secret_value(tmp_path: Path) -> None:
    # quotes and a backslash: JSON escapes them, so a search of the line for the value
    # would miss it; the formatter redacts before escaping
    value = 'tok-"' + uuid.uuid4().hex + '\\x'
    resolve_http(settings_of(tmp_path), {"VERACITY_SECRET_CONTROL_TOKEN": value})
    try:
        raise RuntimeError(f"upstream answered 401 to Bearer {value}")
    except RuntimeError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("veracity.worker", logging.ERROR, __file__, 1,
                               "step failed: %s", (f"token {value}",), exc_info)
    record.detail = {"headers": {"authorization": f"Bearer {value}"}, "n": 1}
    record.seen = [value, 2]
    line = JsonFormatter().format(record)
    out = json.loads(line)
    assert value not in line and value not in json.dumps(out, ensure_ascii=False)
    assert value not in repr(out)
    assert out["message"] == "step failed: token [secret control_token]"
    assert out["detail"] == {"headers": {"authorization": "Bearer [secret control_token]"},
                             "n": 1}
    assert out["seen"] == ["[secret control_token]", 2]
    assert "upstream answered 401 to Bearer [secret control_token]" in out["exception"]
