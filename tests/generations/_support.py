"""The generation reconciler's tests with real processes: a copy of examples/generations/
in the test's folder (its configuration on a free port, its cron entry out of the way), a
``veracity server`` of a chosen deployment, and the API answers they are checked with."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.test_server import VERACITY, free_port
from veracity._tls import ssl_context

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "generations"
DOC_ORIGIN = "127.0.0.1:8000"
RECONCILER = "example:service/reconciler.run"
WORKER = "example:service/worker.run-cancellable"
LEGACY = "example:service/worker.run"
# the example's cron entry fires every minute: a slot passing during a test would add a run
# of the reconciler to those the test starts (and counts); here it fires once a year
NEVER_DURING_A_TEST = '"0 0 1 1 *"'
UNFINISHED = ("pending", "running", "blocked", "paused")


def copy_example(folder: Path) -> int:
    """examples/generations/ copied to ``folder``, served on a free port; the port."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("service.py", "keys.txt", "veracity.toml"):
        shutil.copyfile(EXAMPLE / name, folder / name)
    port = free_port()
    config = (EXAMPLE / "veracity.toml").read_text()
    assert DOC_ORIGIN in config and 'schedule = "* * * * *"' in config
    (folder / "veracity.toml").write_text(
        config.replace(DOC_ORIGIN, f"127.0.0.1:{port}")
        .replace('"* * * * *"', NEVER_DURING_A_TEST))
    return port


def base_env(database_url: str, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env.update(VERACITY_DATABASE_URL=database_url, VERACITY_PORT=str(port),
               VERACITY_POLL_INTERVAL="0.1", VERACITY_LOG_LEVEL="warning",
               PATH=f"{Path(VERACITY).parent}{os.pathsep}{env.get('PATH', '')}")
    env.update(extra)
    return env


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def describe(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def wait_healthy(served: Served, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0, verify=ssl_context()) as client:
        while time.monotonic() < deadline:
            assert served.proc.poll() is None, f"the server exited:\n{served.describe()}"
            try:
                if client.get(f"{served.url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise AssertionError(f"no answer on /healthz within {timeout}s:\n{served.describe()}")


def stop(served: Served) -> None:
    """SIGTERM, as ``kill`` does: the server stops gracefully, exit 0. A shell line's
    server is the shell's child (the shell waits for it, and exits with its status)."""
    if served.proc.poll() is None:
        pids = [served.proc.pid]
        if served.proc.args[0] == "bash":  # type: ignore[index]
            found = subprocess.run(["pgrep", "-P", str(served.proc.pid)],
                                   capture_output=True, text=True)
            pids = [int(p) for p in found.stdout.split()] or pids
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
    assert served.proc.wait(timeout=20) == 0, served.describe()


@contextmanager
def server(folder: Path, env: dict[str, str], deployment: str, *args: str,
           command: str | None = None) -> Iterator[Served]:
    """``veracity server`` of ``deployment`` run in ``folder`` (or ``command``, a shell
    line, there), healthy; stopped (killed if it is still running) afterwards."""
    log = folder / f"{deployment}.log"  # a shell line sends its stderr there itself
    argv = (["bash", "-c", command] if command is not None
            else [VERACITY, "server", *args])
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=folder, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL if command is not None else out,
                                env={**env, "VERACITY_DEPLOYMENT_ID": deployment},
                                start_new_session=True)
    served = Served(proc, f"http://127.0.0.1:{env['VERACITY_PORT']}", log)
    try:
        wait_healthy(served)
        yield served
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def managed(client: httpx.Client, url: str) -> list[dict[str, Any]]:
    """Every execution of the workers (managed and legacy), newest first."""
    got = client.get(f"{url}/v1/executions",
                     params={"ffqn_prefix": LEGACY, "limit": 1000})
    assert got.status_code == 200, got.text
    items: list[dict[str, Any]] = got.json()["items"]
    return items


def by_key(items: list[dict[str, Any]], *statuses: str) -> dict[str, list[tuple[str, str]]]:
    """key -> [(deployment, id)] of the managed executions in ``statuses``."""
    out: dict[str, list[tuple[str, str]]] = {}
    for item in items:
        if item["ffqn"] == WORKER and item["status"] in statuses:
            out.setdefault(item["params"][0], []).append((item["deployment_id"], item["id"]))
    return out
