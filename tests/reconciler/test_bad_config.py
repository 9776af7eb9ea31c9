"""A misconfigured engine or external workflow, a feature this version lacks, or a bad
reconciler setting stops ``veracity server`` and ``veracity worker`` at once: exit 1, one
line on stderr naming the entry or key at fault, no traceback, the port never bound, the
database never opened."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.reconciler._support import (
    ENV,
    FAST,
    VERACITY,
    config_toml,
    free_port,
    process_env,
)

pytestmark = pytest.mark.timeout(60)

GOOD = config_toml("http://127.0.0.1:5678", "http://127.0.0.1:8000")


def swap(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new)


CASES: list[tuple[str, str, dict[str, str | None], list[str]]] = [
    ("bad-url", swap('base_url = "http://127.0.0.1:5678"', 'base_url = "not a url"'), {},
     ["engines.n8n", "base_url"]),
    ("ftp-url", swap('base_url = "http://127.0.0.1:5678"', 'base_url = "ftp://host/x"'), {},
     ["engines.n8n", "base_url"]),
    ("bad-port", swap('base_url = "http://127.0.0.1:5678"', 'base_url = "http://h:99999"'), {},
     ["engines.n8n", "base_url"]),
    ("no-base-url", swap('base_url = "http://127.0.0.1:5678"\n', ""), {},
     ["engines.n8n", "base_url"]),
    ("api-key-unset", GOOD, {"N8N_API_KEY": None}, ["engines.n8n", "N8N_API_KEY"]),
    ("api-key-empty", GOOD, {"N8N_API_KEY": "  "}, ["engines.n8n", "N8N_API_KEY"]),
    ("no-api-key-env", swap('api_key_env = "N8N_API_KEY"\n', ""), {},
     ["engines.n8n", "api_key_env"]),
    ("key-in-file", swap('api_key_env = "N8N_API_KEY"', 'api_key = "secret"'), {},
     ["engines.n8n", "api_key"]),
    ("login-half", swap('login_password_env = "N8N_PASSWORD"\n', ""), {},
     ["engines.n8n", "login"]),
    ("password-unset", GOOD, {"N8N_PASSWORD": None}, ["engines.n8n", "N8N_PASSWORD"]),
    ("unknown-key", swap('timeout = 5.0', 'timeout = 5.0\nretries = 3'), {},
     ["engines.n8n", "retries"]),
    ("bad-timeout", swap('timeout = 5.0', 'timeout = "soon"'), {},
     ["engines.n8n", "timeout"]),
    ("unknown-engine", swap('engine = "n8n"', 'engine = "zapier"'), {},
     ["external_workflow[0]", FAST, "zapier"]),
    ("bad-limit", swap('max_duration = "300ms"', 'max_duration = "a while"'), {},
     ["external_workflow[0]", "max_duration"]),
    ("bad-webhook", swap('webhook = "/webhook/fulfil"\nmax_duration = "300ms"',
                         'webhook = "webhook/fulfil"\nmax_duration = "300ms"'), {},
     ["external_workflow[0]", "webhook"]),
    # a bad retention, and tokens in the file, are refused, never ignored
    ("retention-bad", GOOD + '\n[retention]\nterminal = "-7d"\n', {},
     ["veracity.toml:", "retention.terminal", "cannot be negative"]),
    ("tokens", GOOD + '\n[[tokens]]\nname = "ci"\n', {},
     ["veracity.toml:", "tokens: API tokens live in the database", "veracity token create"]),
    ("stop-flag-after", GOOD + '\n[reconciler]\nstop_flag_after = "0.5s"\n', {},
     ["veracity.toml:", "reconciler.stop_flag_after", "greater than or equal to 1"]),
    ("stop-flag-after-env", GOOD, {"VERACITY_STOP_FLAG_AFTER": "31d"},
     ["VERACITY_STOP_FLAG_AFTER", "less than or equal to 2592000"]),
]


@pytest.mark.parametrize(("toml", "env", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
async def test_misconfigured_engine_stops_the_server_at_once(
    tmp_path: Path, toml: str, env: dict[str, str | None], expected: list[str]
) -> None:
    config = tmp_path / "veracity.toml"
    config.write_text(toml)
    port = free_port()
    full = process_env(f"sqlite:///{tmp_path}/v.db", {
        **ENV, "VERACITY_CONFIG": str(config), "VERACITY_PORT": str(port)})
    for key, value in env.items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        VERACITY, "server", env=full, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    elapsed = time.monotonic() - started
    stderr = err.decode()
    assert proc.returncode == 1, (proc.returncode, stderr, out.decode())
    assert elapsed < 15
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for word in expected:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in stderr
    assert "secret" not in stderr
    assert "Veracity is serving" not in out.decode()
    assert not (tmp_path / "v.db").exists(), "nothing may start before the check"


async def test_the_good_configuration_starts(tmp_path: Path) -> None:
    """The baseline the cases above break: it passes the same start-up check."""
    config = tmp_path / "veracity.toml"
    config.write_text(GOOD)
    full = process_env(f"sqlite:///{tmp_path}/v.db", {
        **ENV, "VERACITY_CONFIG": str(config), "VERACITY_PORT": str(free_port())})
    proc = await asyncio.create_subprocess_exec(
        VERACITY, "server", env=full, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert b"Veracity is serving" in line
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)


@pytest.mark.parametrize(("toml", "env", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
async def test_misconfigured_engine_stops_the_worker_at_once(
    tmp_path: Path, toml: str, env: dict[str, str | None], expected: list[str]
) -> None:
    config = tmp_path / "veracity.toml"
    config.write_text(toml)
    full = process_env(f"sqlite:///{tmp_path}/v.db", {**ENV, "VERACITY_CONFIG": str(config)})
    for key, value in env.items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    proc = await asyncio.create_subprocess_exec(
        VERACITY, "worker", env=full, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    stderr = err.decode()
    assert proc.returncode == 1, (proc.returncode, stderr, out.decode())
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for word in expected:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in stderr and "secret" not in stderr
    assert "Veracity worker" not in out.decode()
    assert not (tmp_path / "v.db").exists(), "nothing may start before the check"


async def test_the_worker_checks_before_waiting_for_the_database(tmp_path: Path) -> None:
    """A worker waits patiently for an unreachable database; a misconfigured engine is
    reported at once all the same, before any attempt to reach it."""
    config = tmp_path / "veracity.toml"
    config.write_text(GOOD)
    full = process_env(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere",
                       {**ENV, "VERACITY_CONFIG": str(config)})
    full.pop("N8N_API_KEY")
    proc = await asyncio.create_subprocess_exec(
        VERACITY, "worker", env=full, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    stderr = err.decode()
    assert proc.returncode == 1, (proc.returncode, stderr, out.decode())
    assert stderr.strip() == ("error: engines.n8n: api_key_env N8N_API_KEY is not set in the "
                              "environment"), stderr


async def test_the_good_configuration_starts_a_worker(tmp_path: Path) -> None:
    config = tmp_path / "veracity.toml"
    config.write_text(GOOD)
    full = process_env(f"sqlite:///{tmp_path}/v.db", {**ENV, "VERACITY_CONFIG": str(config)})
    proc = await asyncio.create_subprocess_exec(
        VERACITY, "worker", env=full, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert b"Veracity worker" in line and b"running 3 workflows" in line, line
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)
