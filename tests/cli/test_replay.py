"""``veracity replay ID``, run as a real process on both backends: an execution's history,
really recorded by a worker in-process, replayed against the app the command loads
(docs/workflows.md, "Checking a code change against production histories"). Exit 0 when
consistent, 1 with the first divergence; ``--json``; bad input (unknown or malformed id, a
workflow the app does not register, no app, a run delegated to an external engine) exits 1
with one error line. The database is read, never written.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.cli.test_cli import VERACITY, Result, assert_failure, ok, table_field
from tests.durable._support import (
    DEPLOYMENT,
    history,
    make_worker,
    running,
    submit,
    wait_kind,
    wait_status,
)
from tests.testing import replay_apps as ra
from veracity import App, Context
from veracity.cli.main import replay_execution
from veracity.config import load_settings
from veracity.control import MAX_HISTORY_LIMIT, ExecutionService
from veracity.core.states import Status
from veracity.models import Claim, NewExecution
from veracity.runtime import open_runtime
from veracity.store import Store, open_store
from veracity.worker.journal import step_name

REPO = Path(__file__).resolve().parents[2]
APPS = "tests.testing.replay_apps"
EXTERNAL = "ext:n8n/fulfil.run"
CONFIG = f"""\
public_url = "http://127.0.0.1:1"

[engines.n8n]
base_url = "http://127.0.0.1:1"
api_key_env = "REPLAY_TEST_N8N_KEY"

[[external_workflow]]
ffqn = "{EXTERNAL}"
engine = "n8n"
webhook = "/webhook/fulfil"
"""


loop_app = App("replay-loop")


def _noop() -> None:
    return None


@loop_app.workflow("rep:loop/run.fn")
async def loop(ctx: Context, n: int) -> int:
    for _ in range(n):
        ctx.now()  # cheap calls: each one event, written with the step after them
    await ctx.step(_noop)
    return n


def env_for(database_url: str, app: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env["VERACITY_DATABASE_URL"] = database_url
    if app is not None:
        env["VERACITY_APP"] = app
    env["PYTHONPATH"] = str(REPO)
    env["REPLAY_TEST_N8N_KEY"] = "not-used"  # the engine is configured, never called
    return env


def veracity(env: dict[str, str], cwd: Path, *args: str) -> Result:
    return subprocess.run([VERACITY, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


async def record(store: Store, tmp_path: Path) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """One order run to its end, one run of an external workflow delegated to its engine;
    returns the order's id, its child's, and the delegated run's."""
    service = ExecutionService(store, workflows=set(ra.app.workflows),
                               deployment_id=DEPLOYMENT)
    async with running(make_worker(store, ra.app)):
        ex = await submit(store, ra.PROCESS, str(tmp_path / "marks"), "o-1")
        await wait_kind(store, ex.id, "recv_started")
        await service.send(ex.id, "approval", {"by": "ada"})
        done = await wait_status(store, ex.id, Status.COMPLETED, Status.FAILED)
    assert done.status == Status.COMPLETED, done.error
    child = next(e for e in await history(store, ex.id) if e.kind == "child_submitted")
    # a delegation as the worker writes it before it triggers the engine
    new = NewExecution(ffqn=EXTERNAL, params=["o-9"], deployment_id=DEPLOYMENT,
                       id=uuid.uuid4())
    await store.execution_submit(new)
    (claimed,) = await store.execution_claim("w-ext", [EXTERNAL], limit=1,
                                             lease_ttl=timedelta(seconds=30))
    delegated = await store.execution_delegate_if_owned(
        Claim(claimed.id, "w-ext", claimed.lease_epoch), "n8n",
        hashlib.sha256(b"t").hexdigest())
    assert delegated.applied
    return ex.id, uuid.UUID(child.data["child_id"]), claimed.id


async def snapshot(store: Store, ids: list[uuid.UUID]) -> list[Any]:
    out: list[Any] = []
    for ident in ids:
        ex = await store.execution_get(ident)
        assert ex is not None
        out.append((ex.status, ex.updated_at, ex.history_seq,
                    [(e.seq, e.kind) for e in await history(store, ident)]))
    return out


async def test_replay_command(database_url: str, tmp_path: Path) -> None:
    store = await open_store(database_url, pool_size=4)
    try:
        order, child, external = await record(store, tmp_path)
        before = await snapshot(store, [order, child, external])
    finally:
        await store.close()
    config = tmp_path / "veracity.toml"
    config.write_text(CONFIG)
    marks = (tmp_path / "marks").read_text()

    def cli(app: str | None, *args: str) -> Result:
        return veracity(env_for(database_url, app), tmp_path, *args)

    calls: dict[str, tuple[str | None, tuple[str, ...]]] = {
        "same": (f"{APPS}:app", ("replay", str(order))),
        "same_json": (f"{APPS}:app", ("replay", "--json", str(order))),
        "renamed": (f"{APPS}:renamed", ("replay", str(order))),
        "other_args_json": (f"{APPS}:other_args", ("replay", "--json", str(order))),
        "removed": (f"{APPS}:removed", ("replay", str(order))),
        "added": (f"{APPS}:added", ("replay", str(order))),
        "added_json": (None, ("replay", "--json", "--app", f"{APPS}:added", str(order))),
        "child": (f"{APPS}:app", ("replay", str(child))),
        "unknown": (f"{APPS}:app", ("replay", str(uuid.uuid4()))),
        "malformed": (f"{APPS}:app", ("replay", "not-an-id")),
        "unregistered": (f"{APPS}:renamed", ("replay", str(child))),
        "no_app": (None, ("replay", str(order))),
        "external": (f"{APPS}:app", ("replay", "--config", str(config), str(external))),
    }
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(cli, app, *args) for name, (app, args) in calls.items()}
        got = {name: future.result() for name, future in futures.items()}

    charge = f"step {step_name(ra.charge)}"
    # consistent: exit 0, the fields and the outcome
    out = ok(got["same"])
    assert table_field(out, "id") == str(order)
    assert table_field(out, "ffqn") == ra.PROCESS
    assert table_field(out, "consistent") == "yes"
    assert table_field(out, "position") == "-"
    assert table_field(out, "calls replayed") == "8"
    assert table_field(out, "ran to its end") == "yes"
    assert out.splitlines()[-1] == ("consistent: the workflow ran to its end (it returned) "
                                    "making exactly the 8 calls its history records")
    assert json.loads(ok(got["same_json"])) == {
        "execution_id": str(order), "ffqn": ra.PROCESS, "consistent": True,
        "position": None, "message": out.splitlines()[-1], "replayed": 8, "finished": True,
        "recorded": None, "new": None, "waiting": False}
    assert table_field(ok(got["child"]), "consistent") == "yes"

    # a divergence: exit 1, the outcome on stdout (it is not an error of the command)
    renamed = got["renamed"]
    assert renamed.returncode == 1 and "Traceback" not in renamed.stderr, renamed
    assert table_field(renamed.stdout, "consistent") == "NO"
    assert table_field(renamed.stdout, "position") == "0"
    assert renamed.stdout.splitlines()[-1] == (
        f"nondeterminism at position 0: the history has {charge}, but the workflow now "
        f"calls step {step_name(ra.bill)}")
    other = got["other_args_json"]
    assert other.returncode == 1, other
    body = json.loads(other.stdout)
    assert (body["consistent"], body["position"], body["finished"]) == (False, 0, False)
    assert body["recorded"].startswith(f"{charge} with arguments ")
    removed = got["removed"]
    assert removed.returncode == 1, removed
    assert table_field(removed.stdout, "position") == "7"
    assert table_field(removed.stdout, "ran to its end") == "yes"
    assert removed.stdout.splitlines()[-1] == (
        "the workflow finished but its history holds calls this code never made: "
        f"step {step_name(ra.ship)} at position 7")

    # a call added at the end: consistent so far, 8 replayed, the rest is new: exit 0
    added = ok(got["added"])
    assert table_field(added, "consistent") == "yes"
    assert table_field(added, "position") == "8"
    assert table_field(added, "calls replayed") == "8"
    assert table_field(added, "ran to its end") == "no"
    assert added.splitlines()[-1].startswith("consistent so far: replayed 8 recorded calls")
    added_json = json.loads(ok(got["added_json"]))
    assert added_json["new"] == f"step {step_name(ra.notify)}"

    # bad input: exit 1, one error line
    assert_failure(got["unknown"], "does not exist")
    assert_failure(got["malformed"], "not an execution id")
    assert_failure(got["unregistered"], f"runs workflow {ra.SEND!r}",
                   f"the app {APPS}:renamed does not register")
    assert_failure(got["no_app"], "replay needs the app", "--app")
    assert_failure(got["external"], f"runs {EXTERNAL} in the external engine n8n",
                   "replay applies to Veracity's own workflows")

    # nothing was written, and no step ran again
    store = await open_store(database_url, pool_size=1)
    try:
        assert await snapshot(store, [order, child, external]) == before
    finally:
        await store.close()
    assert (tmp_path / "marks").read_text() == marks


def test_help_names_replay(tmp_path: Path) -> None:
    env = env_for(f"sqlite:///{tmp_path}/x.db", None)
    out = ok(veracity(env, tmp_path, "--help"))
    assert "replay" in out
    text = ok(veracity(env, tmp_path, "replay", "--help"))
    assert "Exit 0 when the code is consistent with the history" in " ".join(text.split())
    assert not (tmp_path / "x.db").exists()


def test_replay_of_a_history_longer_than_a_page(sqlite_url: str, tmp_path: Path) -> None:
    """The command reads the whole history, page after page (10 000 events each): its
    own code, run in-process (a replay of a part would say the rest is new)."""
    async def go() -> Any:
        store = await open_store(sqlite_url, pool_size=2)
        try:
            async with running(make_worker(store, loop_app)):
                ex = await submit(store, "rep:loop/run.fn", 10_050)
                done = await wait_status(store, ex.id, Status.COMPLETED, Status.FAILED,
                                         timeout=120)
            assert done.status == Status.COMPLETED, done.error
            events = await store.history_list(ex.id, limit=3 * MAX_HISTORY_LIMIT)
            assert len(events) > MAX_HISTORY_LIMIT  # more than a page
        finally:
            await store.close()
        settings = load_settings(None, env={"VERACITY_DATABASE_URL": sqlite_url,
                                            "VERACITY_APP": f"{__name__}:loop_app"})
        rt = await open_runtime(settings)
        try:
            return await replay_execution(rt, str(ex.id))
        finally:
            await rt.close()

    result = asyncio.run(go())
    assert result.consistent and result.finished and result.replayed == 10_051, result

