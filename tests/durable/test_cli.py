"""The control commands of the ``veracity`` CLI, run as real processes on both backends:
submit --paused, pause, unpause, send, cancel (a non-cancellable one exits 1 with a hint to
pause), each with --json output that parses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.conftest import run_async
from veracity.store import open_store

REPO = Path(__file__).resolve().parents[2]
_found = shutil.which("veracity", path=str(Path(sys.executable).parent))
assert _found is not None, "the veracity console script is not installed in this venv"
VERACITY: str = _found

Result = subprocess.CompletedProcess[str]


def env_for(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env["VERACITY_DATABASE_URL"] = database_url
    env["VERACITY_APP"] = "tests.workflows:app"
    env["PYTHONPATH"] = str(REPO)
    return env


def veracity(env: dict[str, str], cwd: Path, *args: str) -> Result:
    return subprocess.run([VERACITY, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


def ok_json(result: Result) -> Any:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def kinds_of(database_url: str, execution_id: str) -> list[str]:
    async def go() -> list[str]:
        store = await open_store(database_url, pool_size=1)
        try:
            return [e.kind for e in await store.history_list(uuid.UUID(execution_id))]
        finally:
            await store.close()

    return run_async(go())


def test_cli_submit_paused_pause_unpause_send_cancel(database_url: str, tmp_path: Path) -> None:
    env = env_for(database_url)

    def run(*args: str) -> Result:
        return veracity(env, tmp_path, *args)

    # two executions, submitted side by side (each process costs about half a second)
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain_f = pool.submit(run, "submit", "--json", "--paused", "test:recv/run.fn", '"t"')
        canc_f = pool.submit(run, "submit", "--json", "--paused",
                             "test:waiter/wait.run-cancellable", '"w"')
        plain, cancellable = ok_json(plain_f.result()), ok_json(canc_f.result())
    assert plain["status"] == "paused" and plain["params"] == ["t"]
    assert cancellable["status"] == "paused"
    pid, cid = plain["id"], cancellable["id"]

    out = ok_json(run("unpause", "--json", pid))
    assert out["id"] == pid and out["status"] == "pending" and out["changed"] is True
    out = ok_json(run("pause", "--json", "--by", "ada", "--reason", "look first", pid))
    assert out["status"] == "paused" and out["changed"] is True
    got = ok_json(run("get", "--json", pid))  # who and why: its waiting reason says
    assert got["waiting_reason"].startswith("paused by ada while pending: look first"), got
    out = ok_json(run("pause", "--json", pid))  # again: unchanged
    assert out["status"] == "paused" and out["changed"] is False

    sent = ok_json(run("send", "--json", pid, "t", '{"k": [1, 2]}'))
    assert sent["execution_id"] == pid and sent["topic"] == "t"
    assert isinstance(sent["message_id"], int) and sent["created_at"]

    # cancel of a non-cancellable: exit 1, one line on stderr that suggests pausing
    with ThreadPoolExecutor(max_workers=2) as pool:
        refused_f = pool.submit(run, "cancel", pid)
        refused_json_f = pool.submit(run, "cancel", "--json", pid)
        refused, refused_json = refused_f.result(), refused_json_f.result()
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert refused.stdout == ""
    err = refused.stderr.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    assert "pause" in err.lower() and "-cancellable" in err
    assert "Traceback" not in refused.stderr
    assert refused_json.returncode == 1 and refused_json.stderr.startswith("error:")

    out = ok_json(run("cancel", "--json", cid))
    assert out["status"] == "cancelled" and out["changed"] is True
    out = ok_json(run("cancel", "--json", cid))  # twice: 0, unchanged
    assert out["status"] == "cancelled" and out["changed"] is False

    # the human-readable forms, for one command each
    text = run("unpause", pid)
    assert text.returncode == 0 and f"unpause: {pid} is pending" in text.stdout, text
    text = run("send", pid, "t")
    assert text.returncode == 0 and "sent message" in text.stdout and pid in text.stdout, text

    # wrong state and unknown or malformed id: exit 1 with one error line
    failures: list[tuple[tuple[str, ...], str]] = [
        (("unpause", pid), "not paused"),
        (("send", cid, "t", "1"), "cancelled"),
        (("pause", str(uuid.uuid4())), "does not exist"),
        (("pause", cid, "--reason", "  "), "reason"),
        (("cancel", "not-an-id"), "not an execution id"),
    ]
    with ThreadPoolExecutor(max_workers=len(failures)) as pool:
        results = list(pool.map(lambda f: run(*f[0]), failures))
    for (args, fragment), result in zip(failures, results, strict=True):
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("error:") and fragment in result.stderr, (
            args, result.stderr)

    listed = ok_json(run("list", "--json", "--status", "cancelled"))
    assert [i["id"] for i in listed["items"]] == [cid]
    assert kinds_of(database_url, pid) == [
        "paused", "pending", "paused", "message_arrived", "pending", "message_arrived"]
    assert kinds_of(database_url, cid) == ["paused", "cancel_requested", "cancelled"]
