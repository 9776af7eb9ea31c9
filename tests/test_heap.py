"""The garbage collector's settings of a long-running process (veracity/_heap.py,
docs/operations.md "Memory and the garbage collector"): what ``settle`` does, checked in
fresh interpreters (the test process's own collector is left alone), and that a real
``veracity worker`` and a real ``veracity server`` run their workflows settled."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._helpers import pg_store_fixture
from tests.durable._procs import Processes, registered, wait_until
from tests.durable._support import DEPLOYMENT
from tests.test_server import STOP_TIMEOUT, app_env, free_port, server_process, wait_for
from veracity._heap import YOUNG
from veracity.core.states import Status
from veracity.models import NewExecution
from veracity.store import Store

SETTINGS = "test:gc/settings.fn"

store = pg_store_fixture(pool_size=2, name="store")


def interpreter(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it prints the JSON this answers."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


REPORT = ("print(json.dumps({'threshold': gc.get_threshold(), "
          "'frozen': gc.get_freeze_count()}))")


def test_settle_freezes_and_raises_the_young_threshold_from_the_default() -> None:
    got = interpreter(f"""
import gc, json
import veracity
from veracity._heap import settle
assert gc.get_freeze_count() == 0
settle()
{REPORT}
""")
    assert got["threshold"][0] == YOUNG > 700, got
    assert got["frozen"] > 1000, got  # every module's objects, not a handful


def test_settle_keeps_thresholds_an_application_set() -> None:
    got = interpreter(f"""
import gc, json
import veracity  # as an app module does first: `from veracity import App`
gc.set_threshold(300, 5, 5)
from veracity._heap import settle
settle()
{REPORT}
""")
    assert got["threshold"] == [300, 5, 5], got
    assert got["frozen"] > 1000, got  # still frozen


def test_settle_sets_the_configured_threshold() -> None:
    got = interpreter(f"""
import gc, json
import veracity
from veracity._heap import settle
settle(2500)
{REPORT}
""")
    assert got["threshold"][0] == 2500, got


@pytest.mark.real_exec  # not forked from the tests' zygote, which froze its own heap
@pytest.mark.timeout(60)
async def test_a_worker_runs_its_workflows_settled(
    pg_url: str, store: Store, procs: Processes
) -> None:
    w = procs.worker(pg_url, "A", env={"VERACITY_DEPLOYMENT_ID": DEPLOYMENT})
    await registered(w)
    new = NewExecution(ffqn=SETTINGS, params=[], deployment_id=DEPLOYMENT, id=uuid.uuid4())
    ident = (await store.execution_submit(new)).execution.id

    async def ended() -> Any:
        e = await store.execution_get(ident)
        return e if e is not None and e.status.is_terminal else None

    done = await wait_until(ended, 20, what="the execution to end", describe=w.describe)
    assert done.status == Status.COMPLETED, done
    assert done.result == {"young": YOUNG, "frozen": True}, done


@pytest.mark.real_exec
def test_a_server_and_its_in_process_worker_run_settled(tmp_path: Path) -> None:
    port = free_port()
    env = app_env(f"sqlite:///{tmp_path}/heap.db", port)
    with server_process(tmp_path, env, port) as server:
        server.wait_healthy()
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            made = client.post("/v1/executions", json={"ffqn": SETTINGS, "params": []})
            assert made.status_code == 201, made.text

            def ended() -> dict[str, Any] | None:
                body: dict[str, Any] = client.get(f"/v1/executions/{made.json()['id']}").json()
                return body if body["status"] in ("completed", "failed") else None

            body = wait_for(ended, 10, "the execution to end", server.stderr)
        assert (body["status"], body["result"]) == ("completed",
                                                    {"young": YOUNG, "frozen": True}), body
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=STOP_TIMEOUT) == 0, server.stderr()


def test_a_threshold_of_zero_leaves_them_and_still_freezes() -> None:
    got = interpreter(f"""
import gc, json
pythons = list(gc.get_threshold())
import veracity
from veracity._heap import settle
settle(0)
assert list(gc.get_threshold()) == pythons, (gc.get_threshold(), pythons)
{REPORT}
""")
    assert got["threshold"][0] < YOUNG, got
    assert got["frozen"] > 1000, got
