"""docs/client.md promises runnable examples: its Python scripts and its shell blocks run
against a real server serving the example shop with a worker, on PostgreSQL and on
SQLite, and print what the guide says they print; the constructors' signatures it shows
are the real ones, each parameter described below it."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import veracity
from tests.test_server import Server, free_port, server_env, server_process

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "client.md"
DOC_ORIGIN = "localhost:8000"  # where the shell blocks expect the server (`make run`)


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), flags=re.S)


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    """The environment the guide assumes: the server's database and the example shop's
    app (VERACITY_DATABASE_URL, VERACITY_APP), the project's ``veracity`` on PATH."""
    port = free_port()
    found = server_env(database_url, port, VERACITY_POLL_INTERVAL="0.1s")
    found["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{found.get('PATH', '')}"
    return found


@pytest.fixture
def live(env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    """``veracity server --worker`` on loopback, serving the example shop."""
    with server_process(tmp_path, env, int(env["VERACITY_PORT"]), ["--worker"]) as server:
        server.wait_healthy()
        yield server


def test_the_scripts_print_what_the_guide_says(
    live: Server, env: dict[str, str], tmp_path: Path
) -> None:
    script, async_script, direct_script = blocks("python")
    printed = blocks("text")[1]
    outputs = []
    for n, code in enumerate((script, async_script, direct_script)):
        path = tmp_path / f"script{n}.py"
        path.write_text(code)
        ran = subprocess.run([sys.executable, str(path)],
                             env={**env, "VERACITY_URL": live.url}, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, check=False)
        assert ran.returncode == 0, ran.stderr
        outputs.append(ran.stdout)
    assert outputs[0] == printed
    assert outputs[1].splitlines() == ["queued mail to grace@example.com: Hello",
                                       "completed", "paused", "completed"]
    assert outputs[2].splitlines() == ["queued mail to linus@example.com: Hi", "completed"]


def run_shell(block: str, env: dict[str, str], cwd: Path) -> str:
    """Run *block* as a reader would paste it into bash; its stdout."""
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, f"exit {ran.returncode}\n{ran.stdout}\n{ran.stderr}"
    return ran.stdout


def test_the_shell_blocks_run(live: Server, env: dict[str, str], tmp_path: Path) -> None:
    cli_block, curl_block = blocks("sh")
    env = {**env, "VERACITY_URL": live.url}

    # the CLI, straight to the database: --wait and --follow print each ended execution
    out = run_shell(cli_block, env, tmp_path)
    assert re.findall(r"^status +(.*)$", out, flags=re.M) == ["completed", "completed"], out
    assert re.findall(r"^result +(.*)$", out, flags=re.M) == [
        "queued mail to ada@example.com: Welcome", "queued mail to bob@example.com: Hi"], out
    submitted = re.findall(r"^([0-9a-f-]{36})  submitted$", out, flags=re.M)
    assert len(submitted) == 2, out
    assert "2 submitted, 0 already submitted (same idempotency key)" in out.splitlines()
    with httpx.Client(base_url=live.url, timeout=5.0) as client:
        orders = [client.get(f"/v1/executions/{id_}").json() for id_ in submitted]
    assert [(o["ffqn"], o["params"], o["idempotency_key"]) for o in orders] == [
        ("shop:orders/process.run", ["o-1", 2500], "o-1"),
        ("shop:orders/process.run", ["o-2"], "o-2")]

    # over HTTP: a batch of one, then its execution once it has ended (a long poll)
    assert DOC_ORIGIN in curl_block
    out = run_shell(curl_block.replace(DOC_ORIGIN, f"127.0.0.1:{live.port}"), env, tmp_path)
    answer: dict[str, Any] = json.loads(out)
    assert (answer["ffqn"], answer["params"], answer["status"], answer["result"]) == (
        "shop:mail/send.run", ["ada@example.com", "Hi"], "completed",
        "queued mail to ada@example.com: Hi")


def shown(name: str, signature: inspect.Signature) -> str:
    """*signature* as the guide writes one: names and defaults, no annotations."""
    parts: list[str] = []
    starred = False  # a bare `*` or `*args` already ends the positional parameters
    for param in signature.parameters.values():
        if param.kind is param.KEYWORD_ONLY and not starred:
            parts.append("*")
        starred = starred or param.kind in (param.KEYWORD_ONLY, param.VAR_POSITIONAL)
        prefix = ("*" if param.kind is param.VAR_POSITIONAL
                  else "**" if param.kind is param.VAR_KEYWORD else "")
        default = "" if param.default is param.empty else f"={param.default!r}"
        parts.append(f"{prefix}{param.name}{default}")
    return f"{name}({', '.join(parts)})"


def test_the_methods_shown_are_the_real_ones() -> None:
    """The table "Methods": every public method of Client and of AsyncClient (but closing
    one), each with its real parameters and defaults, ``id`` standing for
    ``execution_id`` as the table says."""
    section = GUIDE.read_text().split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
    assert "`id` stands for the parameter `execution_id`" in section
    first_cells = [row.split(" | ")[0] for row in section.splitlines()
                   if row.startswith("| `")]
    listed = re.findall(r"`(\w+)(\(.*?\))`", " ".join(first_cells))
    assert len(listed) == 12
    for cls, closing in ((veracity.Client, "close"), (veracity.AsyncClient, "aclose")):
        public = {m for m in dir(cls) if not m.startswith("_")} - {closing}
        assert sorted(name for name, _ in listed) == sorted(public), cls
        for name, params in listed:
            signature = inspect.signature(getattr(cls, name))
            real = signature.replace(parameters=[
                p.replace(name="id") if p.name == "execution_id" else p
                for p in list(signature.parameters.values())[1:]])  # not self
            assert name + params == shown(name, real), (cls, name)


def test_the_constructors_shown_are_the_real_ones() -> None:
    text = GUIDE.read_text()
    found = re.findall(r"```text\n(\w+)(\(.*\))\n```\n\n((?:(?:- |  ).*\n)+)", text)
    assert [name for name, _, _ in found] == ["Client", "AsyncDatabaseClient"]
    for name, params, described in found:
        signature = inspect.signature(getattr(veracity, name))
        assert name + params == shown(name, signature)
        # each parameter has its bullet below the block, in the signature's order
        assert re.findall(r"^- `(\w+)`:", described, flags=re.M) == list(
            signature.parameters), name
    # "Connecting" is AsyncClient's too: the same parameters and defaults
    assert shown("Client", inspect.signature(veracity.AsyncClient)) == shown(
        "Client", inspect.signature(veracity.Client))
