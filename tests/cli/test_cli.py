"""The ``veracity`` command line, run as a real process against real databases.

Each process costs about half a second of CPU, so independent commands run side by side
(which also makes two concurrent ``submit``s with one idempotency key part of the test).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.api._workers import register_workers
from tests.api.conftest import stable
from tests.conftest import run_async
from veracity.cli.output import fmt_time

APP = "veracity.examples.shop:app"
ORDERS = "shop:orders/process.run"
MAIL = "shop:mail/send.run"
MONITOR = "shop:monitor/stock.run-cancellable"
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"

_found = shutil.which("veracity", path=str(Path(sys.executable).parent))
assert _found is not None, "the veracity console script is not installed in this venv"
VERACITY: str = _found

Result = subprocess.CompletedProcess[str]


def base_env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env["VERACITY_DATABASE_URL"] = database_url
    env["VERACITY_APP"] = APP
    return env


def run(args: list[str], env: dict[str, str], cwd: Path) -> Result:
    return subprocess.run([VERACITY, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)


def run_all(calls: dict[str, tuple[list[str], dict[str, str], Path]]) -> dict[str, Result]:
    """Run independent commands side by side."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = {name: pool.submit(run, *call) for name, call in calls.items()}
        return {name: future.result() for name, future in futures.items()}


def ok(result: Result) -> str:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def ok_json(result: Result) -> Any:
    return json.loads(ok(result))


def assert_failure(result: Result, *fragments: str) -> str:
    """Exit 1 with one line on stderr starting ``error:``, nothing on stdout."""
    assert result.returncode == 1, (result.args, result.returncode, result.stdout,
                                    result.stderr)
    err = result.stderr.strip()
    assert "Traceback" not in result.stderr, result.stderr
    assert len(err.splitlines()) == 1, result.stderr
    assert err.startswith("error: "), result.stderr
    assert result.stdout == "", result.stdout
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def assert_usage_error(result: Result, *fragments: str) -> None:
    """Exit 2 with click's usage message, no traceback."""
    assert result.returncode == 2, (result.args, result.returncode, result.stdout,
                                    result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "Usage:" in result.stderr and "Error:" in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def table_field(output: str, name: str) -> str:
    """The value on the ``name  value`` line of a key/value table."""
    for line in output.splitlines():
        if line.startswith(name + " ") and line[len(name):].startswith("  "):
            return line[len(name):].strip()
    raise AssertionError(f"no {name!r} line in:\n{output}")


def test_commands_on_a_real_database(database_url: str, tmp_path: Path) -> None:
    env = base_env(database_url)

    def call(*args: str) -> tuple[list[str], dict[str, str], Path]:
        return list(args), env, tmp_path

    key_args = ["--params", '["a@example.com", "hi"]', "--idempotency-key", "mail-1",
                "--scheduled-at", "2030-01-01T00:00:00Z"]
    first = run_all({
        "migrate": call("migrate"),
        "table": call("submit", ORDERS, '"o-1"', "250"),
        "keyed": call("submit", "--json", MAIL, *key_args),
        "keyed-again": call("submit", "--json", MAIL, *key_args),
        "monitor": call("submit", MONITOR, '"sku-1"', "--json"),
    })
    assert "up to date" in ok(first["migrate"])

    out = ok(first["table"])
    match = re.search(r"^submitted: ([0-9a-f-]{36})$", out, re.MULTILINE)
    assert match, out
    order_id = match.group(1)
    assert table_field(out, "id") == order_id
    assert table_field(out, "ffqn") == ORDERS
    assert table_field(out, "status") == "pending"
    assert json.loads(table_field(out, "params")) == ["o-1", 250]

    keyed = ok_json(first["keyed"])
    assert keyed["status"] == "pending"
    assert keyed["ffqn"] == MAIL
    assert keyed["params"] == ["a@example.com", "hi"]
    assert keyed["idempotency_key"] == "mail-1"
    assert keyed["scheduled_at"].startswith("2030-01-01T00:00:00")
    assert {"id", "result", "error", "attempt", "deployment_id", "parent_id", "created_at",
            "updated_at"} <= keyed.keys()
    # two processes submitting with one key at the same time: one execution
    assert ok_json(first["keyed-again"])["id"] == keyed["id"]
    monitor = ok_json(first["monitor"])
    assert monitor["params"] == ["sku-1"]
    assert monitor["status"] == "pending"
    ids = {order_id, keyed["id"], monitor["id"]}
    assert len(ids) == 3

    second = run_all({
        "again": call("submit", MAIL, *key_args),
        "get": call("get", order_id),
        "get-json": call("get", keyed["id"], "--json"),
        "list": call("list"),
        "running": call("list", "--json", "--status", "running", "--status", "paused"),
        "page-1": call("list", "--json", "--status", "pending", "--limit", "2"),
        "history-json": call("history", order_id, "--json"),
        "history": call("history", order_id),
    })
    again = ok(second["again"])
    assert f"already submitted (same idempotency key): {keyed['id']}" in again

    got = ok(second["get"])
    assert table_field(got, "id") == order_id
    assert table_field(got, "status") == "pending"
    assert table_field(got, "ffqn") == ORDERS
    assert stable(ok_json(second["get-json"])) == stable(keyed)
    # why each waits (no worker is registered here): in get, get --json and list
    assert table_field(got, "waiting") == f"no live worker runs {ORDERS}"
    assert ok_json(second["get-json"])["waiting_reason"] == (
        f"scheduled for 2030-01-01T00:00:00Z; no live worker runs {MAIL}")
    notes = {line.split()[0]: line for line in ok(second["list"]).splitlines()[1:]}
    assert notes[order_id].endswith(f"no live worker runs {ORDERS}"), notes
    assert notes[keyed["id"]].endswith(
        f"scheduled for 2030-01-01T00:00:00Z; no live worker runs {MAIL}"), notes

    listing = ok(second["list"]).splitlines()
    assert listing[0].split()[:6] == ["ID", "FFQN", "STATUS", "ATTEMPT", "CREATED", "AT"]
    assert {line.split()[0] for line in listing[1:]} == ids
    assert all(line.split()[2] == "pending" for line in listing[1:])

    assert ok_json(second["running"]) == {"items": [], "next_cursor": None}

    page_1 = ok_json(second["page-1"])
    assert set(page_1) == {"items", "next_cursor"}
    assert len(page_1["items"]) == 2
    assert page_1["next_cursor"]

    history = ok_json(second["history-json"])
    assert [(e["seq"], e["kind"]) for e in history["items"]] == [(1, "pending")]
    assert history["next_cursor"] is None
    lines = ok(second["history"]).splitlines()
    assert lines[0].split()[:3] == ["SEQ", "AT", "KIND"]
    assert lines[1].split()[0] == "1" and "pending" in lines[1]

    page_2 = ok_json(run(["list", "--json", "--status", "pending", "--limit", "2",
                          "--cursor", page_1["next_cursor"]], env, tmp_path))
    assert len(page_2["items"]) == 1
    assert page_2["next_cursor"] is None
    walked = [e["id"] for e in page_1["items"] + page_2["items"]]
    assert set(walked) == ids and len(walked) == 3
    # newest first
    created = [e["created_at"] for e in page_1["items"] + page_2["items"]]
    assert created == sorted(created, reverse=True)


async def _count(url: str) -> int:
    from veracity.models import ExecutionFilter
    from veracity.store import open_store

    store = await open_store(url)
    try:
        return len(await store.execution_list(ExecutionFilter(), limit=1000))
    finally:
        await store.close()


def test_errors_and_exit_codes(sqlite_url: str, tmp_path: Path) -> None:
    env = base_env(sqlite_url)
    bad_toml = tmp_path / "bad-toml"
    bad_toml.mkdir()
    (bad_toml / "veracity.toml").write_text('app = "veracity.examples.shop:app"\nport = = 3\n')
    bad_value = tmp_path / "bad-value"
    bad_value.mkdir()
    (bad_value / "veracity.toml").write_text('# settings\n\n[worker]\nconcurrency = 0\n')
    fresh = f"sqlite:///{tmp_path}/fresh.db"
    unknown = str(uuid.uuid4())

    def call(*args: str, cwd: Path = tmp_path,
             **env_over: str) -> tuple[list[str], dict[str, str], Path]:
        return list(args), {**env, **env_over}, cwd

    results = run_all({
        # exit 1: errors
        "unknown-id": call("get", unknown),
        "malformed-id": call("get", "not-an-id"),
        "malformed-id-history": call("history", "1234"),
        "unknown-workflow": call("submit", "shop:orders/process.nope", '"o-1"'),
        "invalid-ffqn": call("submit", "Not A Name"),
        "too-early": call("submit", ORDERS, '"o"', "--scheduled-at", "1900-01-01T00:00:00Z"),
        "bad-cursor": call("list", "--cursor", "garbage"),
        "unreachable": call("list", VERACITY_DATABASE_URL=UNREACHABLE),
        "bad-toml": call("list", cwd=bad_toml),
        "bad-value": call("list", cwd=bad_value),
        "bad-url": call("list", VERACITY_DATABASE_URL="mysql://x/y"),
        # params over max_payload_bytes: a configured limit, and the default (1 MiB) in
        # arguments each under the kernel's 128 KiB limit for one argument
        "params-over-limit": call("submit", ORDERS, json.dumps("x" * 1100),
                                  VERACITY_MAX_PAYLOAD_BYTES="1024"),
        "params-json-over-limit": call("submit", ORDERS, "--params",
                                       json.dumps(["o-1", "x" * 1100]),
                                       VERACITY_MAX_PAYLOAD_BYTES="1024"),
        "params-over-default-limit": call("submit", ORDERS,
                                          *[json.dumps("x" * 120_000)] * 9),
        # exit 2: usage
        "unknown-option": call("list", "--bogus"),
        "unknown-command": call("frobnicate"),
        "limit-0": call("list", "--limit", "0"),
        "limit-1001": call("list", "--limit", "1001"),
        "workers-limit-0": call("workers", "--limit", "0"),
        "workers-limit-1001": call("workers", "--limit", "1001"),
        "workers-limit-abc": call("workers", "--limit", "abc"),
        "non-json-param": call("submit", ORDERS, "o-1"),
        "params-not-array": call("submit", ORDERS, "--params", '{"order_id": "o-1"}'),
        "params-and-args": call("submit", ORDERS, '"o-1"', "--params", '["o-1"]'),
        "bad-time": call("submit", ORDERS, '"o"', "--scheduled-at", "tomorrow"),
        "naive-time": call("submit", ORDERS, '"o"', "--scheduled-at", "2030-01-01T00:00:00"),
        "bogus-status": call("list", "--status", "bogus"),
        # success: migrating a brand-new database
        "fresh-migrate": call("migrate", "--database-url", fresh),
    })
    assert_failure(results["unknown-id"], unknown, "does not exist")
    assert_failure(results["malformed-id"], "not-an-id", "not an execution id")
    assert_failure(results["malformed-id-history"], "not an execution id")
    assert_failure(results["unknown-workflow"], "unknown workflow", "shop:orders/process.nope")
    assert_failure(results["invalid-ffqn"], "Not A Name")
    assert_failure(results["too-early"], "scheduled_at")
    assert_failure(results["bad-cursor"], "cursor")
    assert_failure(results["unreachable"], "database")
    assert_failure(results["bad-toml"], "veracity.toml:2")
    assert_failure(results["bad-value"], "veracity.toml:4", "concurrency")
    assert_failure(results["bad-url"], "mysql")
    assert_failure(results["params-over-limit"], "params is 1104 bytes", "limit is 1024")
    assert_failure(results["params-json-over-limit"], "params is 1110 bytes", "limit is 1024")
    assert_failure(results["params-over-default-limit"], "params", "limit is 1048576")

    assert_usage_error(results["unknown-option"], "--bogus")
    assert_usage_error(results["unknown-command"], "frobnicate")
    assert_usage_error(results["limit-0"], "--limit", "0 is not in the range 1<=x<=1000")
    assert_usage_error(results["limit-1001"], "--limit",
                       "1001 is not in the range 1<=x<=1000")
    assert_usage_error(results["workers-limit-0"], "--limit", "1<=x<=1000")
    assert_usage_error(results["workers-limit-1001"], "--limit", "1<=x<=1000")
    assert_usage_error(results["workers-limit-abc"], "--limit", "abc")
    assert_usage_error(results["non-json-param"], "o-1")
    assert_usage_error(results["params-not-array"], "--params")
    assert_usage_error(results["params-and-args"])
    assert_usage_error(results["bad-time"], "--scheduled-at")
    assert_usage_error(results["naive-time"], "--scheduled-at")
    assert_usage_error(results["bogus-status"], "--status", "bogus")

    assert re.search(r"applied migrations 1\b", ok(results["fresh-migrate"]))

    # nothing was written by any of the failures
    assert run_async(_count(sqlite_url)) == 0


WORKER_COLUMNS = ["ID", "LIVE", "HOST", "PID", "DEPLOYMENT", "CONCURRENCY", "STARTED AT",
                  "LAST HEARTBEAT", "STOPPED AT", "WORKFLOWS"]


def table_rows(output: str, columns: list[str]) -> list[dict[str, str]]:
    """The rows of a table whose header line names ``columns`` in order (cells are
    left-aligned under their header; headers may contain a space)."""
    header, *lines = output.splitlines()
    starts = [header.index(c) for c in columns]
    assert starts == sorted(starts) and header.split() == " ".join(columns).split(), header
    bounds = [*starts[1:], None]
    return [{c: line[a:b].strip() for c, a, b in zip(columns, starts, bounds, strict=True)}
            for line in lines]


def test_workers_lists_registered_workers(database_url: str, tmp_path: Path) -> None:
    env = base_env(database_url)
    empty = run_all({"table": (["workers"], env, tmp_path),
                     "json": (["workers", "--json"], env, tmp_path)})
    assert table_rows(ok(empty["table"]), WORKER_COLUMNS) == []
    assert ok_json(empty["json"]) == {"items": [], "next_cursor": None}

    registered = run_async(register_workers(database_url))
    results = run_all({
        "table": (["workers"], env, tmp_path),
        "json": (["workers", "--json"], env, tmp_path),
        "limited": (["workers", "--json", "--limit", "1"], env, tmp_path),
    })

    rows = table_rows(ok(results["table"]), WORKER_COLUMNS)
    assert [r["ID"] for r in rows] == [w.info.id for w in registered]
    for row, w in zip(rows, registered, strict=True):
        assert row["LIVE"] == ("yes" if w.live else "no"), row
        assert row["HOST"] == w.info.host, row
        assert row["PID"] == str(w.info.pid), row
        assert row["DEPLOYMENT"] == w.info.deployment_id, row
        assert row["CONCURRENCY"] == str(w.info.concurrency), row
        assert row["STARTED AT"] == fmt_time(w.started_at), row
        assert row["LAST HEARTBEAT"] == fmt_time(w.started_at), row
        assert row["STOPPED AT"] == fmt_time(w.stopped_at), row
        assert row["WORKFLOWS"] == ", ".join(w.info.ffqns), row

    listed = ok_json(results["json"])
    assert set(listed) == {"items", "next_cursor"} and listed["next_cursor"] is None
    assert [i["id"] for i in listed["items"]] == [w.info.id for w in registered]
    for item, w in zip(listed["items"], registered, strict=True):
        assert set(item) == {"id", "host", "pid", "deployment_id", "workflows",
                             "upgrade_auto", "concurrency", "started_at", "last_heartbeat",
                             "stopped_at", "heartbeat_interval", "live"}, item
        assert (item["host"], item["pid"], item["deployment_id"], item["workflows"],
                item["concurrency"], item["heartbeat_interval"], item["live"]) == (
            w.info.host, w.info.pid, w.info.deployment_id, w.info.ffqns,
            w.info.concurrency, w.info.heartbeat_interval, w.live)
        assert datetime.fromisoformat(item["started_at"]) == w.started_at
        assert datetime.fromisoformat(item["last_heartbeat"]) == w.started_at
        stopped = item["stopped_at"]
        assert (datetime.fromisoformat(stopped) if stopped else None) == w.stopped_at

    assert [i["id"] for i in ok_json(results["limited"])["items"]] == ["w-live"]


@pytest.mark.real_exec  # the console script itself, as installed (tests/_zygote.py)
def test_help_lists_the_commands(tmp_path: Path) -> None:
    out = ok(run(["--help"], base_env(f"sqlite:///{tmp_path}/x.db"), tmp_path))
    for command in ("server", "migrate", "submit", "get", "list", "history"):
        assert re.search(rf"^\s+{command}\b", out, re.MULTILINE), out
    assert not (tmp_path / "x.db").exists()


def test_commands_never_create_a_database(tmp_path: Path) -> None:
    """In a folder with no database, every command but `migrate` and `server` (which
    migrate) says so and creates nothing: no empty file is left behind."""
    env = base_env("sqlite:///./veracity.db")
    eid = str(uuid.uuid4())
    results = run_all({name: (args, env, tmp_path) for name, args in {
        "list": ["list"], "get": ["get", eid], "history": ["history", eid],
        "workers": ["workers"], "flagged": ["list", "--flagged"],
        "crons": ["crons"], "deployments": ["deployments"],
        "adopt": ["deployments", "adopt", "d-old"],
        "submit": ["submit", "shop:orders/process.run", '"o-1"', "1"],
        "cancel": ["cancel", eid], "pause": ["pause", eid], "unpause": ["unpause", eid],
        "retry": ["retry", eid], "send": ["send", eid, "topic", "1"],
        "resolve": ["resolve", eid, "--fail", "--reason", "gone"],
        "replay": ["replay", eid],
        "token create": ["token", "create", "--name", "ci", "--scope", "admin"],
        "token list": ["token", "list"], "token revoke": ["token", "revoke", "ci"],
    }.items()})
    for result in results.values():
        assert_failure(result, "no Veracity database at veracity.db",
                       "run `veracity migrate` or set database_url")
    assert list(tmp_path.iterdir()) == []
    # an empty file is not a Veracity database either, and stays as it was
    (tmp_path / "veracity.db").write_bytes(b"")
    assert_failure(run(["list"], env, tmp_path), "holds no Veracity database")
    assert (tmp_path / "veracity.db").read_bytes() == b""


def test_a_worker_started_before_its_database_has_tables_waits_for_them(
        tmp_path: Path) -> None:
    """`veracity worker` is the one command besides migrate and server that opens a
    database with no tables (README, CLI): it waits, saying so, and runs work once a
    migration made them; SIGTERM then stops it (exit 0)."""
    env = base_env("sqlite:///./veracity.db")
    err = tmp_path / "worker.err"
    with err.open("wb") as stderr:
        worker = subprocess.Popen([VERACITY, "worker"], env=env, cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 20
        while "database unavailable, retrying: no such table" not in err.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        ok(run(["migrate"], env, tmp_path))
        done = ok(run(["submit", MAIL, '"a@x"', '"hi"', "--wait"], env, tmp_path))
        assert table_field(done, "status") == "completed", done
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    assert code == 0, err.read_text()


def test_read_commands_need_no_engine_secrets(database_url: str, tmp_path: Path) -> None:
    """A configuration with an engine whose API key variable is not set: the commands that
    only read work; one that may ask the engine says what is missing."""
    config = tmp_path / "veracity.toml"
    config.write_text('public_url = "http://127.0.0.1:9"\n[engines.n8n]\n'
                      'base_url = "http://127.0.0.1:9"\napi_key_env = "N8N_KEY_NOT_SET"\n')
    env = {**base_env(database_url), "VERACITY_CONFIG": str(config)}
    env.pop("N8N_KEY_NOT_SET", None)
    ok(run(["migrate"], env, tmp_path))
    for args in (["list"], ["workers"], ["list", "--flagged"]):
        ok(run(args, env, tmp_path))
    assert_failure(run(["cancel", str(uuid.uuid4())], env, tmp_path),
                   "api_key_env N8N_KEY_NOT_SET is not set")


def test_the_app_module_is_found_in_the_current_folder(tmp_path: Path) -> None:
    """As uvicorn and celery do: VERACITY_APP names a module in the current folder, with
    no PYTHONPATH."""
    (tmp_path / "myflows.py").write_text(
        "from veracity import App, Context\n\napp = App()\n\n\n"
        "@app.workflow('mine:flows/hello.run')\n"
        "async def hello(ctx: Context, name: str) -> str:\n    return 'hi ' + name\n")
    env = {**base_env(f"sqlite:///{tmp_path}/v.db"), "VERACITY_APP": "myflows:app"}
    env.pop("PYTHONPATH", None)
    ok(run(["migrate"], env, tmp_path))
    out = ok(run(["submit", "mine:flows/hello.run", '"ada"'], env, tmp_path))
    assert out.startswith("submitted: ")


def test_history_full_and_an_empty_flagged_list(database_url: str, tmp_path: Path) -> None:
    env = base_env(database_url)
    ok(run(["migrate"], env, tmp_path))
    long_text = "word " * 60
    out = ok(run(["submit", MAIL, json.dumps(long_text.strip()), '"hi"'], env, tmp_path))
    eid = out.split()[1]
    short_table = ok(run(["history", eid], env, tmp_path))
    assert long_text.strip() not in short_table  # shortened in the table
    whole = ok(run(["history", eid, "--full"], env, tmp_path))
    assert long_text.strip() in whole and whole.startswith("1  ")
    assert ok(run(["list", "--flagged"], env, tmp_path)).strip() == "nothing flagged"


def test_history_is_paged_as_the_api_pages_it(database_url: str, tmp_path: Path) -> None:
    """`--limit` cuts a page: its next_cursor (JSON) or `more: --cursor N` (the table)
    says there is more, and `--cursor N` goes on after it."""
    env = base_env(database_url)
    ok(run(["migrate"], env, tmp_path))
    eid = ok(run(["submit", MAIL, '"a@x"', '"hi"'], env, tmp_path)).split()[1]
    ok(run(["pause", eid], env, tmp_path))
    ok(run(["unpause", eid], env, tmp_path))  # pending, paused, pending: three events
    first = ok_json(run(["history", eid, "--limit", "2", "--json"], env, tmp_path))
    assert [e["seq"] for e in first["items"]] == [1, 2] and first["next_cursor"] == "2"
    rest = ok_json(run(["history", eid, "--limit", "2", "--cursor", "2", "--json"],
                       env, tmp_path))
    assert [e["seq"] for e in rest["items"]] == [3] and rest["next_cursor"] is None
    table = ok(run(["history", eid, "--limit", "1"], env, tmp_path)).splitlines()
    assert table[-1] == "more: --cursor 1" and len(table) == 3, table
    whole = ok(run(["history", eid], env, tmp_path))
    assert "more:" not in whole and len(whole.splitlines()) == 4
    bad = run(["history", eid, "--cursor", "-1"], env, tmp_path)
    assert bad.returncode == 2 and "--cursor" in bad.stderr, bad


def test_veracity_retry(database_url: str, tmp_path: Path) -> None:
    env = base_env(database_url)
    ok(run(["migrate"], env, tmp_path))
    out = ok(run(["submit", MAIL, '"a@x"', '"hi"'], env, tmp_path))
    eid = out.split()[1]
    assert_failure(run(["retry", eid], env, tmp_path), "execution is pending",
                   "only a failed or failed_transient execution can be retried")

    async def fail_it() -> None:
        from datetime import timedelta

        from veracity.models import Claim
        from veracity.store import open_store

        store = await open_store(database_url)
        try:
            [c] = await store.execution_claim("w", [MAIL], limit=1,
                                              lease_ttl=timedelta(minutes=1))
            assert (await store.execution_fail_if_owned(Claim(c.id, "w", c.lease_epoch),
                                                        {"code": "x"})).applied
        finally:
            await store.close()

    run_async(fail_it())
    retried = ok_json(run(["retry", eid, "--json"], env, tmp_path))
    assert retried["retry_of"] == eid and retried["status"] == "pending"
    out = ok(run(["retry", eid], env, tmp_path))
    assert out.startswith("retried: ") and f"(retry of {eid})" in out
    assert_failure(run(["retry", str(uuid.uuid4())], env, tmp_path), "does not exist")
