"""``veracity token create | list | revoke`` as real processes against real databases: the
token is printed once and only its digest is stored; listing never shows it; bad input is
one ``error:`` line and writes nothing (docs/security.md)."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.cli.test_cli import (
    assert_failure,
    assert_usage_error,
    base_env,
    ok,
    ok_json,
    run,
    run_all,
    table_rows,
)
from tests.conftest import run_async
from tests.store._support import RawSQL
from veracity.control import TokenService
from veracity.core.tokens import Scope
from veracity.errors import Forbidden, Unauthorized
from veracity.models import ApiToken
from veracity.store import open_store, token_hash

TOKEN = re.compile(r"vrc_[0-9a-f]{16}_[A-Za-z0-9_-]{43}")
COLUMNS = ["NAME", "KEY ID", "SCOPES", "STATE", "CREATED AT", "EXPIRES AT", "REVOKED AT",
           "LAST USED"]


async def _check(url: str, value: str, needed: Scope) -> ApiToken | Exception:
    store = await open_store(url)
    try:
        return await TokenService(store).authenticate(value, needed, route="GET /v1/x")
    except (Unauthorized, Forbidden) as exc:
        return exc
    finally:
        await store.close()


def check(url: str, value: str, needed: Scope) -> ApiToken | Exception:
    """What the API would decide for this token on a route that needs ``needed``."""
    return run_async(_check(url, value, needed))


def count_tokens(url: str) -> int:
    return int(RawSQL(url).scalar("SELECT count(*) FROM veracity_api_tokens"))


def test_create_list_revoke(database_url: str, tmp_path: Path) -> None:
    env = base_env(database_url)
    created = run(["token", "create", "--name", "reconciler", "--scope", "executions:read",
                   "--scope", "executions:cancel", "--scope", "executions:read",
                   "--expires", "30d"], env, tmp_path)
    out = ok(created)
    assert TOKEN.fullmatch(out.strip()), out  # stdout is the token alone
    value = out.strip()
    assert created.stderr.startswith(
        "created API token 'reconciler' (executions:read, executions:cancel; expires ")
    assert "shown only this once" in created.stderr
    assert value not in created.stderr

    as_json = ok_json(run(["token", "create", "--name", "ci.deploy-2", "--scope", "admin",
                           "--json"], env, tmp_path))
    assert TOKEN.fullmatch(as_json["token"])
    assert as_json["name"] == "ci.deploy-2" and as_json["scopes"] == ["admin"]
    assert as_json["expires_at"] is None and as_json["revoked_at"] is None

    # the token works, for its scopes only
    got = check(database_url, value, Scope.EXECUTIONS_CANCEL)
    assert isinstance(got, ApiToken) and got.name == "reconciler"
    assert isinstance(check(database_url, value, Scope.EXECUTIONS_SUBMIT), Forbidden)
    assert isinstance(check(database_url, as_json["token"], Scope.EXECUTIONS_RESOLVE),
                      ApiToken)

    listed = run_all({"table": (["token", "list"], env, tmp_path),
                      "json": (["token", "list", "--json"], env, tmp_path)})
    table = ok(listed["table"])
    assert value not in table and value.split("_", 2)[2] not in table
    rows = table_rows(table, COLUMNS)
    assert [r["NAME"] for r in rows] == ["reconciler", "ci.deploy-2"]
    first = rows[0]
    assert first["KEY ID"] == value.split("_")[1]
    assert first["SCOPES"] == "executions:read, executions:cancel"
    assert first["STATE"] == "active" and first["REVOKED AT"] == "-"
    assert first["LAST USED"] != "-"  # checked above
    assert rows[1]["EXPIRES AT"] == "-"
    items = ok_json(listed["json"])["items"]
    assert value not in listed["json"].stdout
    assert set(items[0]) == {"name", "key_id", "scopes", "state", "created_at",
                             "expires_at", "revoked_at", "last_used_at"}
    lifetime = (datetime.fromisoformat(items[0]["expires_at"])
                - datetime.fromisoformat(items[0]["created_at"]))
    assert lifetime == timedelta(days=30)

    revoked = ok(run(["token", "revoke", "reconciler"], env, tmp_path))
    assert revoked.startswith("revoked API token 'reconciler'")
    refused = check(database_url, value, Scope.EXECUTIONS_READ)
    assert isinstance(refused, Unauthorized) and "was revoked at" in refused.message
    again = ok(run(["token", "revoke", "reconciler"], env, tmp_path))
    assert "was revoked already at" in again and "nothing to change" in again
    rows = table_rows(ok(run(["token", "list"], env, tmp_path)), COLUMNS)
    assert [(r["NAME"], r["STATE"]) for r in rows] == [("reconciler", "revoked"),
                                                       ("ci.deploy-2", "active")]
    assert rows[0]["REVOKED AT"] != "-"

    # the database keeps the digest, never the token
    texts = [str(r[0]) for r in RawSQL(database_url).execute(
        "SELECT name || key_id || token_hash || scopes FROM veracity_api_tokens")]
    assert any(token_hash(value) in t for t in texts)
    assert not any(value.split("_", 2)[2] in t for t in texts)


@pytest.mark.parametrize(("args", "fragments"), [
    (["--name", "x", "--scope", "executions:write"],
     ["unknown scope 'executions:write'", "executions:read", "admin"]),
    (["--name", "x", "--scope", "executions:read,executions:cancel"],
     ["unknown scope 'executions:read,executions:cancel'"]),
    (["--name", "x", "--scope", "admin", "--expires", "30"],
     ["invalid --expires '30'", "30d"]),
    (["--name", "x", "--scope", "admin", "--expires", "0d"], ["cannot expire at once"]),
    (["--name", "x", "--scope", "admin", "--expires", "-1d"], ["invalid --expires '-1d'"]),
    (["--name", "x", "--scope", "admin", "--expires", "soon"], ["invalid --expires 'soon'"]),
    (["--name", "x", "--scope", "admin", "--expires", "3651d"], ["at most 3650d"]),
    (["--name", "x", "--scope", "admin", "--expires", "9" * 40 + "d"],
     ["invalid --expires"]),
    (["--name", "has space", "--scope", "admin"], ["token name 'has space'"]),
    (["--name", "-dash", "--scope", "admin"], ["token name '-dash'"]),
    (["--name", "x" * 65, "--scope", "admin"], ["1 to 64"]),
])
def test_bad_input_is_one_error_line_and_writes_nothing(
    sqlite_url: str, tmp_path: Path, args: list[str], fragments: list[str]
) -> None:
    result = run(["token", "create", *args], base_env(sqlite_url), tmp_path)
    assert_failure(result, *fragments)
    assert count_tokens(sqlite_url) == 0


def test_an_existing_name_and_an_unknown_one(database_url: str, tmp_path: Path) -> None:
    env = base_env(database_url)
    first = ok(run(["token", "create", "--name", "ops", "--scope", "executions:read"],
                   env, tmp_path)).strip()
    results = run_all({
        "again": (["token", "create", "--name", "ops", "--scope", "admin"], env, tmp_path),
        "revoke": (["token", "revoke", "nobody"], env, tmp_path),
        "no scope": (["token", "create", "--name", "y"], env, tmp_path),
        "no name": (["token", "create", "--scope", "admin"], env, tmp_path),
    })
    assert_failure(results["again"], "a token named 'ops' exists already",
                   "choose another name")
    assert_failure(results["revoke"], "no token named 'nobody'")
    assert_usage_error(results["no scope"], "--scope")
    assert_usage_error(results["no name"], "--name")
    # the first token is as it was, and still the only one
    assert count_tokens(database_url) == 1
    kept = check(database_url, first, Scope.EXECUTIONS_READ)
    assert isinstance(kept, ApiToken) and kept.scopes == ("executions:read",)
    assert isinstance(check(database_url, first, Scope.EXECUTIONS_SUBMIT), Forbidden)


def test_an_unmigrated_database_says_to_migrate(tmp_path: Path) -> None:
    """A database of a Veracity from before tokens (its executions, no token table) says
    to migrate; a missing file says there is no database, and is not created."""
    with contextlib.closing(sqlite3.connect(tmp_path / "old.db")) as conn:
        conn.execute("CREATE TABLE veracity_executions (id TEXT PRIMARY KEY)")
    result = run(["token", "list"], base_env(f"sqlite:///{tmp_path}/old.db"), tmp_path)
    assert_failure(result, "no such table: veracity_api_tokens", "veracity migrate")
    missing = run(["token", "list"], base_env(f"sqlite:///{tmp_path}/none.db"), tmp_path)
    assert_failure(missing, "no Veracity database at", "veracity migrate")
    assert not (tmp_path / "none.db").exists()


def test_help_names_the_token_commands(tmp_path: Path) -> None:
    env = base_env(f"sqlite:///{tmp_path}/x.db")
    out = ok(run(["token", "--help"], env, tmp_path))
    for command in ("create", "list", "revoke"):
        assert re.search(rf"^\s+{command}\b", out, re.MULTILINE), out
    create = ok(run(["token", "create", "--help"], env, tmp_path))
    for scope in Scope:
        assert scope.value in create, create
    assert not (tmp_path / "x.db").exists()
