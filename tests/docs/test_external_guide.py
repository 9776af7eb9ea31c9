"""docs/external.md's "Testing against a fake n8n" walkthrough, run as written: the fake
started by its documented command, a server with the documented veracity.toml and
environment, a submission and its completion through the fake's callback. Only the two
ports are replaced by free ones (the documented ones may be taken on a test machine)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests._pg import free_port
from tests.worker._procs import Processes, veracity_bin

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "external.md"


def section() -> str:
    text = GUIDE.read_text()
    return text[text.index("## Testing against a fake n8n"):]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section(), flags=re.S)


def test_the_documented_fake_n8n_walkthrough_works(tmp_path: Path, procs: Processes) -> None:
    fake_port, api_port = free_port(), free_port()
    start_fake, commands = blocks("sh")
    [toml] = blocks("toml")
    fake_argv = shlex.split(start_fake.strip())
    assert fake_argv[:3] == ["python", "-m", "veracity.testing.fake_n8n"]
    fake_argv = [sys.executable, *fake_argv[1:]]
    fake_argv[fake_argv.index("--port") + 1] = str(fake_port)
    config = toml.replace("5678", str(fake_port)).replace("8000", str(api_port))
    (tmp_path / "veracity.toml").write_text(config)
    lines = [line.split("#")[0].strip() for line in commands.strip().splitlines()]
    exports = dict(pair.split("=", 1) for pair in shlex.split(lines[0])[1:])
    assert lines[1] == "veracity server &"
    submit = shlex.split(lines[2])
    assert submit[:2] == ["veracity", "submit"]

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VERACITY_", "N8N_", "PYTHONPATH"))}
    env.update(exports, VERACITY_PORT=str(api_port))
    for name, argv in (("fake", fake_argv), ("server", [veracity_bin(), "server"])):
        process = procs.worker("", name, argv=argv, start=False)
        process.env = env  # the documented environment, not a test worker's
        process.folder = tmp_path
        process.start()

    # both up before the submission, as the walkthrough's reader sees them (the fake says
    # it is listening): a trigger sent before the fake listens is a failed trigger (a
    # loaded test machine once took longer to start the fake than the server)
    deadline = time.monotonic() + 20
    with httpx.Client(timeout=2) as client:
        while True:
            try:
                if client.get(f"http://127.0.0.1:{api_port}/healthz").status_code == 200:
                    with socket.create_connection(("127.0.0.1", fake_port), timeout=2):
                        break
            except (httpx.TransportError, OSError):
                pass
            assert time.monotonic() < deadline, procs.describe()
            time.sleep(0.1)

    out = subprocess.run([veracity_bin(), *submit[1:]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    match = re.match(r"submitted: ([0-9a-f-]{36})\n", out.stdout)
    assert match, out.stdout
    eid = match.group(1)
    while True:
        got = subprocess.run([veracity_bin(), "get", eid, "--json"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        execution = json.loads(got.stdout)
        if execution["status"] == "completed":
            break
        assert execution["status"] in ("pending", "running"), execution
        assert time.monotonic() < deadline + 20, (execution, procs.describe())
        time.sleep(0.2)
    assert execution["engine"] == "n8n" and execution["external_execution_id"]
