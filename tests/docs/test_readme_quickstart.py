"""README.md's quick start, as a reader follows it once `make run` serves: its shell block
(two curls, then `veracity list` and `veracity history <id>` on the same database) and its
Python client snippet, run against a real `veracity server` started as `make run` starts
it (SQLite at ./veracity.db, the example app, its in-process worker). Only the port
differs (a free one instead of 8000), and `<id>` is the id the first curl answered."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_server import APP, free_port, server_process

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def quick_start_env(port: int) -> dict[str, str]:
    # as `make run` serves: nothing of Veracity's configured but the app and the port
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env.update(VERACITY_APP=APP, VERACITY_PORT=str(port))
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_line(line: str, port: int, env: dict[str, str], cwd: Path) -> str:
    command = line.replace("localhost:8000", f"localhost:{port}").replace(
        ".venv/bin/veracity", str(BIN / "veracity"))
    done = subprocess.run(["bash", "-ec", command], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout


def test_the_quick_start_runs_as_written(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    make_run, shell = blocks("sh")[:2]
    assert make_run.startswith("make run")
    port = free_port()
    env = quick_start_env(port)
    migrated = subprocess.run([str(BIN / "veracity"), "migrate"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=False)
    assert migrated.returncode == 0, migrated.stderr
    assert (tmp_path / "veracity.db").exists()  # ./veracity.db, as the README says
    lines = [line.split("  #")[0].strip() for line in shell.replace("\\\n", " ").splitlines()]
    submit, listing, cli_list, cli_history = (line for line in lines if line)
    with server_process(tmp_path, env, port) as server:
        server.wait_healthy()
        created = json.loads(run_line(submit, port, env, tmp_path))
        assert created["ffqn"] == "shop:orders/process.run"
        assert created["params"] == ["order-1", 2500]
        execution_id = created["id"]
        # the in-process worker runs it: wait for its end before reading its history
        deadline = time.monotonic() + 30
        while True:
            page = json.loads(run_line(listing, port, env, tmp_path))
            [item] = [i for i in page["items"] if i["id"] == execution_id]
            if item["status"] == "completed" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert item["status"] == "completed", item
        receipt = {"order_id": "order-1", "charged_cents": 2500, "receipt": "r-order-1"}
        assert item["result"] == {"order_id": "order-1", "receipt": receipt}
        listed = run_line(cli_list, port, env, tmp_path)
        assert execution_id[:8] in listed and "completed" in listed, listed
        history = run_line(cli_history.replace("<id>", execution_id), port, env, tmp_path)
        assert "pending" in history and "running" in history and "completed" in history, \
            history

        # the Python snippet, pointed at this server instead of port 8000
        [client_snippet] = [b for b in blocks("python") if "from veracity import Client" in b]
        source = client_snippet.replace("http://127.0.0.1:8000", server.url)
        namespace: dict[str, object] = {}
        exec(compile(source, "README.md", "exec"), namespace)
        capsys.readouterr()
        namespace["place_order"]()  # type: ignore[operator]
        assert capsys.readouterr().out == f"{ {'order_id': 'order-1', 'receipt': receipt} }\n"
