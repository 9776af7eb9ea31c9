"""Configuration loading: precedence, file discovery, durations and error messages."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

import veracity.config as config_module
from veracity.config import (
    CONFIG_ENV_VAR,
    ENV_VARS,
    Settings,
    describe,
    load_settings,
    parse_duration,
)
from veracity.errors import ConfigError


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No stray ./veracity.toml from wherever pytest was started.
    monkeypatch.chdir(tmp_path)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def config_error(*args: object, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(*args, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    return message


# --- precedence and discovery ---------------------------------------------------------


def test_defaults() -> None:
    s = load_settings(env={})
    assert s.config_path is None
    assert s.database_url == "sqlite:///./veracity.db"
    assert (s.app, s.host, s.port, s.deployment_id) == (None, "127.0.0.1", 8000, None)
    assert (s.max_payload_bytes, s.log_level) == (1048576, "info")
    assert s.worker.concurrency == 256
    assert s.worker.lease_ttl == 120.0
    assert s.worker.heartbeat_interval is None
    assert (s.worker.poll_interval, s.worker.shutdown_grace) == (1.0, 10.0)
    assert (s.recovery.interval, s.recovery.max_attempts) == (30.0, 5)
    assert (s.reconciler.interval, s.reconciler.concurrency) == (120.0, 16)
    assert s.reconciler.engine_timeout == 10.0
    assert s.reconciler.stop_flag_after == 600.0  # 10 minutes
    assert (s.engines, s.external_workflow, s.public_url) == ({}, [], None)


def test_settings_are_frozen() -> None:
    s = load_settings(env={})
    with pytest.raises(FrozenInstanceError, match="Settings is frozen: port"):
        s.port = 1
    with pytest.raises(FrozenInstanceError, match="WorkerSettings is frozen: concurrency"):
        s.worker.concurrency = 1
    with pytest.raises(FrozenInstanceError, match="Settings is frozen: host cannot be deleted"):
        del s.host
    assert (s.port, s.worker.concurrency, s.host) == (8000, 256, "127.0.0.1")


def test_file_only(tmp_path: Path) -> None:
    path = write(
        tmp_path / "conf.toml",
        'database_url = "postgresql://db/veracity"\n'
        'app = "shop.workflows:app"\n'
        "port = 9000\n"
        "[worker]\n"
        "concurrency = 4\n"
        'lease_ttl = "1m"\n'
        "[recovery]\n"
        "max_attempts = 2\n",
    )
    s = load_settings(path, env={})
    assert s.config_path == path.resolve()
    assert s.database_url == "postgresql://db/veracity"
    assert s.app == "shop.workflows:app"
    assert s.port == 9000
    assert (s.worker.concurrency, s.worker.lease_ttl) == (4, 60.0)
    assert s.recovery.max_attempts == 2
    assert s.host == "127.0.0.1"  # untouched keys keep their defaults


def test_env_beats_file(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", "port = 9000\n[worker]\nconcurrency = 4\nlease_ttl = 60\n")
    env = {"VERACITY_PORT": "9100", "VERACITY_WORKER_CONCURRENCY": "8", "VERACITY_HOST": ""}
    s = load_settings(path, env=env)
    assert s.port == 9100
    assert s.worker.concurrency == 8
    assert s.worker.lease_ttl == 60.0  # the file's value where env is silent
    assert s.host == "127.0.0.1"  # an empty variable counts as unset


def test_flags_beat_env(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", "port = 9000\n")
    env = {"VERACITY_PORT": "9100", "VERACITY_LEASE_TTL": "90s", "VERACITY_HOST": "0.0.0.0"}
    s = load_settings(
        path,
        env=env,
        overrides={"port": 9200, "worker.lease_ttl": "2m", "host": None},
    )
    assert s.port == 9200
    assert s.worker.lease_ttl == 120.0
    assert s.host == "0.0.0.0"  # a None flag means "not given"


def test_env_var_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "elsewhere.toml", "port = 9300\n")
    write(tmp_path / "veracity.toml", "port = 1111\n")
    s = load_settings(env={CONFIG_ENV_VAR: str(path)})
    assert s.port == 9300
    assert s.config_path == path.resolve()


def test_explicit_path_beats_env_var(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", "port = 1001\n")
    b = write(tmp_path / "b.toml", "port = 1002\n")
    assert load_settings(a, env={CONFIG_ENV_VAR: str(b)}).port == 1001


def test_veracity_toml_in_cwd_is_picked_up(tmp_path: Path) -> None:
    write(tmp_path / "veracity.toml", 'host = "0.0.0.0"\n')
    s = load_settings(env={})
    assert s.host == "0.0.0.0"
    assert s.config_path == (tmp_path / "veracity.toml").resolve()


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    message = config_error("missing.toml", env={})
    assert message.startswith("missing.toml: ")
    assert "not found" in message
    message = config_error(env={CONFIG_ENV_VAR: "gone.toml"})
    assert message.startswith("gone.toml: ")
    assert CONFIG_ENV_VAR in message


# --- errors in the file ---------------------------------------------------------------


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "veracity.toml", 'host = "x"\n\nport 8000\n')
    message = config_error(env={})
    assert message.startswith("veracity.toml:3: ")
    assert "Expected '='" in message


def test_wrong_type_in_worker_table_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(
        tmp_path / "conf.toml",
        '# comment\nport = 9000\n\n[worker]\nlease_ttl = 60\nconcurrency = "many"\n',
    )
    message = config_error(path, env={})
    assert message == (
        f"{path}:6: worker.concurrency: "
        "Input should be a valid integer, unable to parse string as an integer"
    )


def test_out_of_range_value_in_file(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", "[recovery]\ninterval = 5\n\n[worker]\nconcurrency = 0\n")
    message = config_error(path, env={})
    assert message == f"{path}:5: worker.concurrency: Input should be greater than or equal to 1"


def test_dotted_key_at_top_level_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", 'host = "h"\nworker.concurrency = 0\n')
    message = config_error(path, env={})
    assert message.startswith(f"{path}:2: worker.concurrency: ")


def test_unknown_key_is_an_error_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", 'host = "h"\nprot = 8000\n')
    assert config_error(path, env={}) == f"{path}:2: prot: unknown key"

    path = write(tmp_path / "conf.toml", '[worker]\nconcurrency = 2\nleas_ttl = "1m"\n')
    assert config_error(path, env={}) == f"{path}:3: worker.leas_ttl: unknown key"

    path = write(tmp_path / "conf.toml", "port = 1\n\n[mystery]\nx = 1\n")
    assert config_error(path, env={}) == f"{path}:3: mystery: unknown key"


def test_config_path_cannot_be_set_in_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", 'config_path = "/etc/other.toml"\n')
    assert config_error(path, env={}) == f"{path}:1: config_path: unknown key"


def test_first_of_several_errors_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", "port = 0\n[worker]\nconcurrency = 0\n")
    message = config_error(path, env={})
    assert message.startswith(f"{path}:1: port: ")


def test_nested_table_errors_find_their_line(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", "port = 1\n[engines]\nn8n = 5\n")
    assert config_error(path, env={}).startswith(f"{path}:3: engines.n8n: ")

    path = write(tmp_path / "conf.toml", "port = 1\nexternal_workflow = [1]\n")
    assert config_error(path, env={}).startswith(f"{path}:2: external_workflow[0]: ")


# --- errors in the environment and flags -----------------------------------------------


def test_invalid_env_var_names_the_variable(tmp_path: Path) -> None:
    write(tmp_path / "veracity.toml", "port = 9000\n")
    message = config_error(env={"VERACITY_PORT": "eighty"})
    assert message == (
        "VERACITY_PORT: Input should be a valid integer, unable to parse string as an integer"
    )
    message = config_error(env={"VERACITY_LEASE_TTL": "soon"})
    assert message.startswith("VERACITY_LEASE_TTL: invalid duration 'soon'")


def test_invalid_flag_names_the_flag() -> None:
    message = config_error(env={"VERACITY_PORT": "9000"}, overrides={"port": 70000})
    assert message == "--port: Input should be less than or equal to 65535"
    message = config_error(env={}, overrides={"worker.shutdown_grace": "later"})
    assert message.startswith("--shutdown-grace: invalid duration 'later'")
    assert config_error(env={}, overrides={"nonsense": 1}) == "--nonsense: unknown key"


def test_flag_inside_a_file_table_is_attributed_to_the_flag(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", "[worker]\nconcurrency = 4\n")
    message = config_error(path, env={}, overrides={"worker.poll_interval": 0})
    assert message == "--poll-interval: Input should be greater than 0"


# --- durations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10m", 600.0),
        ("90s", 90.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("120", 120.0),
        (" 2m 30s ", 150.0),
        (45, 45.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["abc", "", "10x", "m", "-5", "-5s", -1, float("nan"), "1h-30m"])
def test_parse_duration_rejects(bad: str | float) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(bad)


def test_durations_through_every_source(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", 'reconciler.interval = "10m"\n[recovery]\ninterval = 45\n')
    s = load_settings(
        path,
        env={"VERACITY_ENGINE_TIMEOUT": "500ms"},
        overrides={"worker.lease_ttl": "1h30m"},
    )
    assert s.reconciler.interval == 600.0
    assert s.recovery.interval == 45.0
    assert s.reconciler.engine_timeout == 0.5
    assert s.worker.lease_ttl == 5400.0


def test_negative_and_zero_durations_rejected(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", "[worker]\nlease_ttl = -5\n")
    message = config_error(path, env={})
    assert message.startswith(f"{path}:2: worker.lease_ttl: invalid duration -5")
    assert "negative" in message
    message = config_error(env={"VERACITY_RECOVERY_INTERVAL": "0s"})
    assert message == "VERACITY_RECOVERY_INTERVAL: Input should be greater than 0"
    # zero is a valid grace period
    assert load_settings(env={"VERACITY_SHUTDOWN_GRACE": "0"}).worker.shutdown_grace == 0.0


def test_retention_settings(tmp_path: Path) -> None:
    s = load_settings(env={})
    assert (s.retention.terminal, s.retention.interval, s.retention.enabled) == (
        30 * 86400.0, 600.0, True)
    path = write(tmp_path / "conf.toml", '[retention]\nterminal = "7d"\ninterval = "1h"\n')
    s = load_settings(path, env={})
    assert (s.retention.terminal, s.retention.interval) == (7 * 86400.0, 3600.0)
    # 0 keeps everything
    off = load_settings(env={"VERACITY_RETENTION_TERMINAL": "0"}).retention
    assert (off.terminal, off.enabled) == (0.0, False)
    for bad in ["-7d", "-1"]:
        message = config_error(env={"VERACITY_RETENTION_TERMINAL": bad})
        assert message == (f"VERACITY_RETENTION_TERMINAL: invalid duration '{bad}': "
                           "a duration cannot be negative")
    assert config_error(env={"VERACITY_RETENTION_TERMINAL": "a month"}).startswith(
        "VERACITY_RETENTION_TERMINAL: invalid duration 'a month'")
    # a cutoff further back than any date: refused at start, not by every pass
    assert config_error(env={"VERACITY_RETENTION_TERMINAL": "1000000d"}) == (
        "VERACITY_RETENTION_TERMINAL: at most 36500d (100 years)")
    assert load_settings(env={"VERACITY_RETENTION_TERMINAL": "36500d"}
                         ).retention.terminal == 36500 * 86400.0
    path = write(tmp_path / "bad.toml", 'host = "h"\n[retention]\nterminal = "soon"\n')
    assert config_error(path, env={}).startswith(
        f"{path}:3: retention.terminal: invalid duration 'soon'")
    assert config_error(env={"VERACITY_RETENTION_INTERVAL": "0"}) == (
        "VERACITY_RETENTION_INTERVAL: Input should be greater than or equal to 1")


# --- cross-field and shape rules --------------------------------------------------------


def test_heartbeat_defaults_to_a_quarter_of_the_ttl() -> None:
    assert load_settings(env={}).worker.effective_heartbeat_interval == 30.0
    s = load_settings(env={"VERACITY_LEASE_TTL": "1m"})
    assert s.worker.heartbeat_interval is None
    assert s.worker.effective_heartbeat_interval == 15.0
    s = load_settings(env={"VERACITY_HEARTBEAT_INTERVAL": "5s"})
    assert s.worker.effective_heartbeat_interval == 5.0


def test_heartbeat_not_shorter_than_ttl_rejected(tmp_path: Path) -> None:
    message = config_error(env={"VERACITY_LEASE_TTL": "60", "VERACITY_HEARTBEAT_INTERVAL": "1m"})
    assert message.startswith("VERACITY_HEARTBEAT_INTERVAL: must be less than worker.lease_ttl")
    path = write(tmp_path / "conf.toml", "[worker]\nlease_ttl = 30\nheartbeat_interval = 45\n")
    assert config_error(path, env={}).startswith(f"{path}:3: worker.heartbeat_interval: ")


def test_app_shape_validated() -> None:
    assert load_settings(env={"VERACITY_APP": "shop.flows:app"}).app == "shop.flows:app"
    for bad in ["shop.flows", "shop:", ":app", "shop flows:app", "a:b:c"]:
        message = config_error(env={"VERACITY_APP": bad})
        assert message.startswith("VERACITY_APP: must be 'module:attribute'"), bad


def test_other_value_rules() -> None:
    assert load_settings(env={"VERACITY_LOG_LEVEL": "DEBUG"}).log_level == "debug"
    assert config_error(env={"VERACITY_LOG_LEVEL": "loud"}).startswith("VERACITY_LOG_LEVEL: ")
    assert config_error(env={}, overrides={"deployment_id": "x" * 129}).startswith(
        "--deployment-id: "
    )
    assert config_error(env={"VERACITY_MAX_PAYLOAD_BYTES": "100"}).startswith(
        "VERACITY_MAX_PAYLOAD_BYTES: Input should be greater than or equal to 1024"
    )
    assert config_error(env={"VERACITY_WORKER_CONCURRENCY": "10001"}).startswith(
        "VERACITY_WORKER_CONCURRENCY: "
    )


def test_engine_tables_are_read_raw_for_their_own_check(tmp_path: Path) -> None:
    # [engines.<name>] and [[external_workflow]] are validated entry by entry at start by
    # veracity.adapters.config.parse_external (tests/reconciler/test_bad_config.py), not here.
    path = write(
        tmp_path / "conf.toml",
        'public_url = "https://veracity.example"\n'
        "[engines.n8n]\n"
        'kind = "n8n"\n'
        'base_url = "http://localhost:5678"\n'
        "[[external_workflow]]\n"
        'ffqn = "ext:n8n/orders.run"\n'
        'limit = "1h"\n',
    )
    s = load_settings(path, env={})
    assert s.public_url == "https://veracity.example"
    assert s.engines == {"n8n": {"kind": "n8n", "base_url": "http://localhost:5678"}}
    assert s.external_workflow == [{"ffqn": "ext:n8n/orders.run", "limit": "1h"}]


def test_cron_entries_are_read_raw_for_their_own_check(tmp_path: Path) -> None:
    # [[cron]] entries are validated entry by entry at start by
    # veracity.core.cron.parse_cron_entries (tests/core/test_cron.py, tests/cron/), not here
    path = write(
        tmp_path / "conf.toml",
        "[[cron]]\n"
        'name = "nightly"\n'
        'schedule = "0 3 * * *"\n'
        'every = "day"\n'
        "[[cron]]\n"
        'name = "other"\n',
    )
    s = load_settings(path, env={})
    assert s.cron == [{"name": "nightly", "schedule": "0 3 * * *", "every": "day"},
                      {"name": "other"}]
    assert load_settings(env={}).cron == []


def test_cron_must_be_an_array_of_tables(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", 'host = "h"\n[cron]\nname = "nightly"\n')
    assert config_error(path, env={}) == f"{path}:2: cron: Input should be a valid list"


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ('[someday]\nevery = "1h"\n', 3, "someday"),
        ('someday.every = "1h"\n', 3, "someday"),
    ],
)
def test_a_feature_this_version_lacks_is_refused_naming_the_key(
    tmp_path: Path, text: str, line: int, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Never loaded and silently ignored: the process refuses to start, naming file, line, key.
    # No feature is missing today: the mechanism is checked with a made-up one.
    monkeypatch.setattr(config_module, "NOT_SUPPORTED", frozenset({"someday"}))
    assert config_error(env={}, overrides={key: "x"}) == f"--{key.replace('_', '-')}: unknown key"
    path = write(tmp_path / "conf.toml", f'host = "h"\nport = 9000\n{text}')
    reason = "not supported by this version of Veracity"
    assert config_error(path, env={}) == f"{path}:{line}: {key}: {reason}"
    write(tmp_path / "veracity.toml", path.read_text())
    assert config_error(env={}) == f"veracity.toml:{line}: {key}: {reason}"


@pytest.mark.parametrize("text", ['[[tokens]]\nname = "ci"\n', '[tokens]\nci = "s3cret"\n'])
def test_tokens_in_the_file_are_refused_saying_where_they_live(
    tmp_path: Path, text: str
) -> None:
    path = write(tmp_path / "conf.toml", f'host = "h"\nport = 9000\n{text}')
    assert config_error(path, env={}) == (
        f"{path}:3: tokens: API tokens live in the database, hashed, not in the "
        "configuration file: create them with `veracity token create` (docs/security.md)")
    assert config_error(env={}, overrides={"tokens": "x"}) == "--tokens: unknown key"


# --- auth.required ---------------------------------------------------------------------


@pytest.mark.parametrize(("host", "required"), [
    ("127.0.0.1", False), ("127.8.9.10", False), ("::1", False), ("[::1]", False),
    ("localhost", False), ("LocalHost.", False), ("::ffff:127.0.0.1", False),
    ("0.0.0.0", True), ("::", True), ("192.168.1.20", True), ("10.0.0.1", True),
    ("example.internal", True), ("128.0.0.1", True),
])
def test_auth_is_required_unless_the_host_is_loopback(host: str, required: bool) -> None:
    s = load_settings(env={"VERACITY_HOST": host})
    assert s.auth.required is None
    assert s.auth_required is required


def test_auth_required_from_file_env_and_flag(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", 'host = "0.0.0.0"\n[auth]\nrequired = false\n')
    s = load_settings(path, env={})
    assert s.auth.required is False and s.auth_required is False
    s = load_settings(path, env={"VERACITY_AUTH_REQUIRED": "true"})
    assert s.auth_required is True
    s = load_settings(env={"VERACITY_AUTH_REQUIRED": "true"})  # on loopback too
    assert s.host == "127.0.0.1" and s.auth_required is True
    s = load_settings(path, env={}, overrides={"auth.required": True})
    assert s.auth_required is True


def test_auth_bad_values_and_unknown_keys_are_refused(tmp_path: Path) -> None:
    assert config_error(env={"VERACITY_AUTH_REQUIRED": "maybe"}) == (
        "VERACITY_AUTH_REQUIRED: Input should be a valid boolean, unable to interpret input")
    path = write(tmp_path / "conf.toml", 'port = 9000\n[auth]\nmode = "token"\n')
    assert config_error(path, env={}) == f"{path}:3: auth.mode: unknown key"
    path = write(tmp_path / "conf.toml", 'port = 9000\nauth = true\n')
    assert config_error(path, env={}).startswith(f"{path}:2: auth: ")


# --- reconciler.stop_flag_after --------------------------------------------------------


def test_stop_flag_after_from_file_env_and_flag(tmp_path: Path) -> None:
    path = write(tmp_path / "conf.toml", '[reconciler]\nstop_flag_after = "1h"\n')
    assert load_settings(path, env={}).reconciler.stop_flag_after == 3600.0
    env = {"VERACITY_STOP_FLAG_AFTER": "90s"}
    assert load_settings(path, env=env).reconciler.stop_flag_after == 90.0
    s = load_settings(path, env=env, overrides={"reconciler.stop_flag_after": "2m"})
    assert s.reconciler.stop_flag_after == 120.0
    # the bounds themselves are valid
    assert load_settings(env={"VERACITY_STOP_FLAG_AFTER": "1"}).reconciler.stop_flag_after == 1.0
    thirty_days = load_settings(env={"VERACITY_STOP_FLAG_AFTER": "30d"})
    assert thirty_days.reconciler.stop_flag_after == 30 * 86400.0


def test_stop_flag_after_out_of_range_or_not_a_duration(tmp_path: Path) -> None:
    assert config_error(env={"VERACITY_STOP_FLAG_AFTER": "500ms"}) == (
        "VERACITY_STOP_FLAG_AFTER: Input should be greater than or equal to 1"
    )
    assert config_error(env={"VERACITY_STOP_FLAG_AFTER": "30d1s"}) == (
        "VERACITY_STOP_FLAG_AFTER: Input should be less than or equal to 2592000"
    )
    path = write(tmp_path / "conf.toml", 'port = 9000\n[reconciler]\nstop_flag_after = 0\n')
    assert config_error(path, env={}) == (
        f"{path}:3: reconciler.stop_flag_after: Input should be greater than or equal to 1"
    )
    assert config_error(env={"VERACITY_STOP_FLAG_AFTER": "soon"}).startswith(
        "VERACITY_STOP_FLAG_AFTER: invalid duration 'soon'"
    )
    assert config_error(env={"VERACITY_STOP_FLAG_AFTER": "-5m"}).startswith(
        "VERACITY_STOP_FLAG_AFTER: invalid duration '-5m'"
    )
    assert config_error(env={}, overrides={"reconciler.stop_flag_after": "31d"}) == (
        "--stop-flag-after: Input should be less than or equal to 2592000"
    )


# --- documentation table --------------------------------------------------------------


def test_describe_lists_every_variable_with_its_default() -> None:
    rows = describe()
    assert {env for _, env, _ in rows} == {*ENV_VARS.values(), CONFIG_ENV_VAR}
    table = {key: (env, default) for key, env, default in rows}
    assert table["port"] == ("VERACITY_PORT", "8000")
    assert table["worker.lease_ttl"] == ("VERACITY_LEASE_TTL", "120s")
    assert table["worker.heartbeat_interval"][1] == "lease_ttl / 4"
    assert table["reconciler.stop_flag_after"] == ("VERACITY_STOP_FLAG_AFTER", "600s")
    assert table["retention.terminal"] == ("VERACITY_RETENTION_TERMINAL", "30d")
    assert table["retention.interval"] == ("VERACITY_RETENTION_INTERVAL", "600s")
    assert table["auth.required"] == ("VERACITY_AUTH_REQUIRED",
                                      "true, unless host is a loopback address")
    # every documented key is a real setting
    defaults = Settings()
    for key in ENV_VARS:
        node: object = defaults
        for part in key.split("."):
            assert hasattr(node, part), key
            node = getattr(node, part)


def test_worker_metrics_port_out_of_range_or_not_a_number(tmp_path: Path) -> None:
    assert config_error(env={"VERACITY_WORKER_METRICS_PORT": "0"}) == (
        "VERACITY_WORKER_METRICS_PORT: Input should be greater than or equal to 1")
    assert config_error(env={"VERACITY_WORKER_METRICS_PORT": "65536"}) == (
        "VERACITY_WORKER_METRICS_PORT: Input should be less than or equal to 65535")
    assert config_error(env={"VERACITY_WORKER_METRICS_PORT": "http"}).startswith(
        "VERACITY_WORKER_METRICS_PORT: Input should be a valid integer")
    path = write(tmp_path / "conf.toml", '[worker]\nmetrics_host = ""\n')
    assert config_error(path, env={}).startswith(f"{path}:2: worker.metrics_host: ")


def test_gc_young_threshold_from_file_env_and_its_bad_values(tmp_path: Path) -> None:
    assert load_settings(env={}).gc_young_threshold == 10_000
    assert load_settings(env={"VERACITY_GC_YOUNG_THRESHOLD": "0"}).gc_young_threshold == 0
    path = write(tmp_path / "conf.toml", "gc_young_threshold = 50000\n")
    assert load_settings(path, env={}).gc_young_threshold == 50_000
    assert config_error(env={"VERACITY_GC_YOUNG_THRESHOLD": "-1"}) == (
        "VERACITY_GC_YOUNG_THRESHOLD: Input should be greater than or equal to 0")
    assert config_error(env={"VERACITY_GC_YOUNG_THRESHOLD": "10000001"}) == (
        "VERACITY_GC_YOUNG_THRESHOLD: Input should be less than or equal to 10000000")
    assert config_error(env={"VERACITY_GC_YOUNG_THRESHOLD": "lots"}).startswith(
        "VERACITY_GC_YOUNG_THRESHOLD: Input should be a valid integer")
    bad = write(tmp_path / "bad.toml", 'port = 9000\ngc_young_threshold = "1e4"\n')
    assert config_error(bad, env={}).startswith(f"{bad}:2: gc_young_threshold: ")
