"""examples/generations/README.md is true: its commands, exactly as written, run in a copy
of the folder (on a free port instead of 8000, the cron entry out of the way so that only
the runs the README starts happen), and each step shows what the README says it shows."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.generations._support import EXAMPLE, base_env, copy_example, server, stop

pytestmark = pytest.mark.timeout(150)

README = EXAMPLE / "README.md"
FENCE = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
ID = r"[0-9a-f-]{36}"
BLOCKED = "/v1/executions?ffqn_prefix=example:service/worker.run-cancellable&status=blocked"


def readme_lines() -> list[str]:
    return [line.strip() for block in FENCE.findall(README.read_text())
            for line in block.replace("\\\n", " ").splitlines() if line.strip()]


LINES = readme_lines()


def given(line: str) -> str:
    """A command of the README, which must be there exactly as written."""
    assert line in LINES, f"the README no longer says `{line}`"
    return line


class Shell:
    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env
        self.api: httpx.Client | None = None  # the test's own look, to wait without polling
        self.url = f"http://127.0.0.1:{env['VERACITY_PORT']}"

    def wait_api(self, path: str, check: Callable[[Any], Any], what: str,
                 timeout: float = 20.0) -> None:
        """Poll the API (quicker than the CLI) until ``check`` holds of the JSON at
        ``path``."""
        assert self.api is not None
        deadline = time.monotonic() + timeout
        while not check(self.api.get(f"{self.url}{path}").json()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def run(self, line: str) -> str:
        done = subprocess.run(["bash", "-c", line], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        return done.stdout

    def until(self, line: str, check: Callable[[str], Any], what: str,
              timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(line)
            got = check(out)
            if got:
                return got
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{out}"
            time.sleep(0.2)


def result_of(shell: Shell, submit: str) -> str:
    """Run a README `veracity submit` of the reconciler, then its `veracity get <id>` until
    the run has a result."""
    [ident] = re.findall(rf"submitted: ({ID})", shell.run(given(submit)))
    shell.wait_api(f"/v1/executions/{ident}",
                   lambda e: e["status"] in ("completed", "failed"), f"{ident} to end")
    get = given("veracity get <id>").replace("<id>", ident)

    def ended(out: str) -> str | None:
        status = re.search(r"^status\s+(\S+)", out, re.M)
        assert status is not None and status.group(1) != "failed", out
        found = re.search(r"^result\s+(.+)$", out, re.M)
        return found.group(1).strip() if status.group(1) == "completed" and found else None

    result: str = shell.until(get, ended, f"reconciler {ident} to complete")
    return result


def workers(out: str, status: str) -> list[str]:
    """The ids `veracity list` shows for managed workers in ``status``."""
    return re.findall(rf"^({ID})\s+example:service/worker\.run-cancellable\s+{status}\b",
                      out, re.M)


def test_the_readme_walk_through(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    folder = tmp_path / "generations"
    port = copy_example(folder)
    database = f"sqlite:///{folder / 'generations.db'}"
    env = base_env(database, port)
    del env["VERACITY_DATABASE_URL"]  # the example's own configuration names its database
    shell = Shell(folder, env)
    assert LINES[0] == "cd examples/generations"  # the copy is where the test runs

    # 1. a token for the reconciler, and deployment d1
    shell.run(given("veracity migrate"))
    export = next(line for line in LINES if line.startswith("export VERACITY_SECRET_"))
    token = shell.run(export + '; printf %s "$VERACITY_SECRET_CONTROL_TOKEN"').strip()
    assert token.startswith("vrc_")
    env["VERACITY_SECRET_CONTROL_TOKEN"] = token
    looking = shell.run("veracity token create --name test --scope executions:read").strip()
    shell.api = httpx.Client(timeout=10, headers={"Authorization": f"Bearer {looking}"})
    request.addfinalizer(shell.api.close)
    start_d1 = given("VERACITY_DEPLOYMENT_ID=d1 veracity server 2> d1.log &")
    submit_d1 = "VERACITY_DEPLOYMENT_ID=d1 veracity submit example:service/reconciler.run"
    submit_d2 = submit_d1.replace("d1", "d2")
    listing = given("veracity list --ffqn-prefix example:service/worker")
    with server(folder, env, "d1", command=start_d1.removesuffix("&")) as d1:
        assert "worker_reconcile" in shell.run(given("veracity crons"))
        # 2. two workers start
        assert result_of(shell, submit_d1) == "kept 0; started 2"
        shell.wait_api(BLOCKED, lambda page: len(page["items"]) == 2, "two workers")
        first = shell.until(listing, lambda out: sorted(workers(out, "blocked"))
                            if len(workers(out, "blocked")) == 2 else None, "two workers")
        assert shell.api is not None
        assert sorted(shell.api.get(f"{shell.url}/v1/executions/{i}").json()["params"]
                      for i in first) == [["A"], ["B"]]
        given("kill %1")
        stop(d1)

    # 3. a restart within d1 replaces nothing
    with server(folder, env, "d1", command=start_d1.removesuffix("&")) as d1:
        assert result_of(shell, submit_d1) == "kept 2; started 0"
        assert sorted(workers(shell.run(listing), "blocked")) == first
        worker = first[0]
        shell.run(given("veracity send <worker id> work '\"hello\"'")
                  .replace("<worker id>", worker))
        shell.wait_api(f"/v1/executions/{worker}/history?limit=100", lambda page: any(
            e["kind"] == "step_completed" for e in page["items"]), "the message handled")
        shell.until(given("veracity history <worker id>").replace("<worker id>", worker),
                    lambda out: re.search(r'message_received .*"payload": "hello"', out)
                    and re.search(r'step_completed .*"name": "service.handle"', out),
                    "the message to be received and handled")
        assert sorted(workers(shell.run(listing), "blocked")) == first
        stop(d1)

    # 4. deployment d2: the d1 workers are cancelled (still listed), two d2 ones started
    start_d2 = given("VERACITY_DEPLOYMENT_ID=d2 veracity server 2> d2.log &")
    with server(folder, env, "d2", command=start_d2.removesuffix("&")) as d2:
        assert result_of(shell, given(submit_d2)) == "kept 0; started 2"
        shell.wait_api(BLOCKED, lambda page: len(page["items"]) == 2, "two d2 workers")
        out = shell.until(listing, lambda out: out if len(workers(out, "blocked")) == 2
                          else None, "two d2 workers")
        assert sorted(workers(out, "cancelled")) == first
        second = sorted(workers(out, "blocked"))
        assert set(second).isdisjoint(first)
        deployments = shell.run(given("veracity deployments"))
        assert re.search(r"^d2\s.*\s1\s+0\s+0\s+2\s+0\s+0\s*$", deployments, re.M), deployments
        assert re.search(r"^d1\s.*\s0\s+0\s+0\s+0\s+0\s+0\s*$", deployments, re.M), deployments

        # 5. remove a key: it is retired
        shell.run(given("echo A > keys.txt"))
        assert result_of(shell, submit_d2) == "kept 1; started 0"
        out = shell.run(listing)
        assert len(workers(out, "blocked")) == 1
        assert len(workers(out, "cancelled")) == 3

        # 6. a legacy worker is paused, not cancelled
        legacy_out = shell.run(given(
            "VERACITY_DEPLOYMENT_ID=d2 veracity submit example:service/worker.run '\"A\"'"))
        [legacy] = re.findall(rf"submitted: ({ID})", legacy_out)
        assert result_of(shell, submit_d2) == "kept 1; started 0"
        shell.wait_api(f"/v1/executions/{legacy}", lambda e: e["status"] == "paused",
                       "the legacy worker to be paused")
        paused = given("veracity list --ffqn-prefix example:service/worker --status paused")
        shell.until(paused, lambda out: re.search(
            rf"^{legacy}\s+example:service/worker\.run\s+paused\b", out, re.M),
            "the legacy worker to be paused")
        given("kill %1")
        stop(d2)
