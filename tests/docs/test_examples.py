"""Every example in README.md and docs/ is complete: each Python block runs (a document's
blocks together, as one module, the way a reader would paste them), each TOML block loads
as Veracity's configuration, each ``veracity`` command in a shell block is one the CLI
has with options it takes, and each ``curl`` names a route the API serves. The guides
whose examples need a running system are also run end to end by their own tests
(test_workflows_guide.py, test_external_guide.py, test_http_guide.py, ...).

And the README's list of an execution's fields is exactly what the API answers."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import httpx
import pytest

from tests.docs._modules import run_as_module
from veracity.api import create_api
from veracity.api.schemas import ExecutionOut
from veracity.cli.main import cli
from veracity.config import load_settings
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.store import open_store

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


# Documents whose Python example is a script for a running server (it reads the server's
# address and a token from the environment): run against a real server by their own test.
RUN_AGAINST_A_SERVER = {"security.md": "test_security_guide.py",
                        "client.md": "test_client_guide.py"}


def examples(kind: str) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    for path in DOCS:
        for lang, body in FENCE.findall(path.read_text()):
            if lang == kind:
                out.append((path, body))
    return out


def test_the_documents_have_examples_of_each_kind() -> None:
    assert len(examples("python")) >= 10
    assert len(examples("toml")) >= 4
    assert len(examples("sh")) >= 8


# Every fence's language, and what checks its blocks: a block tagged otherwise (``bash``,
# ``console``) would be checked by nothing.
CHECKED_LANGUAGES = {
    "python": "run (test_python_examples_run, or a guide's own test)",
    "toml": "loaded as configuration (test_toml_examples_load_as_configuration)",
    "sh": "its commands checked (test_veracity_commands_in_examples_exist, curl, make)",
    "json": "parsed (test_json_examples_parse); docs/security.md's compared with the API's answers",
    "text": "printed output, compared by a guide's own test where it is one",
    "mermaid": "a diagram of docs/states.md",
    "": "output or a diagram",
}


def test_every_fence_is_of_a_language_the_tests_check() -> None:
    for path in DOCS:
        for lang, _ in FENCE.findall(path.read_text()):
            assert lang in CHECKED_LANGUAGES, f"{path.name}: a ```{lang} block"


@pytest.mark.parametrize("doc", sorted({p for p, _ in examples("python")}),
                         ids=lambda p: p.name)
def test_python_examples_use_no_undefined_name(doc: Path, tmp_path: Path) -> None:
    """A document's Python, as one module, names nothing it does not define or import
    (a function body that no test calls would hide it otherwise)."""
    code = "\n\n".join(body for path, body in examples("python") if path == doc)
    module_path = tmp_path / f"example_{doc.stem.lower()}.py"
    module_path.write_text(code)
    checked = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated",
         "--select", "F821,F822,F823", "--output-format", "concise", str(module_path)],
        capture_output=True, text=True, check=False)
    assert checked.returncode == 0, f"{doc.name}:\n{checked.stdout}{checked.stderr}"


@pytest.mark.parametrize(("doc", "body"), examples("json"),
                         ids=lambda v: v.name if isinstance(v, Path) else "")
def test_json_examples_parse(doc: Path, body: str) -> None:
    json.loads(body)


def test_server_scripts_are_run_by_their_own_tests() -> None:
    here = Path(__file__).parent
    for doc, test in RUN_AGAINST_A_SERVER.items():
        assert any(p.name == doc for p, _ in examples("python")), doc
        source = (here / test).read_text()
        assert f'"{doc}"' in source and 'blocks("python")' in source, (doc, test)


@pytest.mark.parametrize("doc", sorted({p for p, _ in examples("python")
                                        if p.name not in RUN_AGAINST_A_SERVER}),
                         ids=lambda p: p.name)
def test_python_examples_run(doc: Path, tmp_path: Path) -> None:
    code = "\n\n".join(body for path, body in examples("python") if path == doc)
    run_as_module(f"example_{doc.stem.lower()}", code, tmp_path)


@pytest.mark.parametrize(("doc", "body"), examples("toml"),
                         ids=lambda v: v.name if isinstance(v, Path) else "")
def test_toml_examples_load_as_configuration(
    doc: Path, body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = body.lstrip().splitlines()[0]
    if first.startswith("#") and "secrets" in first:
        # a secrets file (docs/http.md): names and values, read by the bindings
        from veracity.bindings import load_secrets_file

        secrets = tmp_path / "secrets.toml"
        secrets.write_text(body)
        secrets.chmod(0o600)
        assert load_secrets_file(secrets)
        return
    config = tmp_path / "veracity.toml"
    config.write_text(body)
    for var in set(re.findall(r'_env\s*=\s*"([A-Z0-9_]+)"', body)):
        monkeypatch.setenv(var, "an-example-value")
    settings = load_settings(config_path=config)
    assert settings.config_path == config


def _commands() -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name, command in cli.commands.items():
        found[name] = command
        if isinstance(command, click.Group):
            for sub, sub_command in command.commands.items():
                found[f"{name} {sub}"] = sub_command
    return found


ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
SUBSTITUTION = re.compile(r"\$\(((?:\.venv/bin/)?veracity\b[^|)]*)")


def _shell_lines() -> list[tuple[Path, str]]:
    """Each command of the shell blocks: a line without its comment, its environment
    prefix (``VERACITY_APP=guide:app veracity server``) and its ``for ... do`` head, plus
    every ``veracity`` command inside a ``$(...)`` (up to a pipe)."""
    out: list[tuple[Path, str]] = []
    for path, body in examples("sh"):
        joined = body.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #")[0].strip().rstrip("&").strip()
            if not line or line.startswith("#"):
                continue
            out.extend((path, inner.strip()) for inner in SUBSTITUTION.findall(line))
            out.append((path, ENV_PREFIX.sub("", line)))
    return out


VERACITY_LINES = [(p, line) for p, line in _shell_lines()
                  if re.match(r"(\.venv/bin/)?veracity\b", line)]
CURL_LINES = [(p, line) for p, line in _shell_lines() if line.startswith("curl ")]
MAKE_LINES = [(p, line) for p, line in _shell_lines() if line.startswith("make ")]


@pytest.mark.parametrize(("doc", "line"), VERACITY_LINES,
                         ids=[f"{p.name}:{i}" for i, (p, _) in enumerate(VERACITY_LINES)])
def test_veracity_commands_in_examples_exist(doc: Path, line: str) -> None:
    words = shlex.split(line.replace("<", "'<").replace(">", ">'"))[1:]
    commands = _commands()
    name = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
    assert name in commands, f"{doc.name}: no command `veracity {name}`"
    command = commands[name]
    taken = {opt for param in command.params for opt in getattr(param, "opts", [])}
    for word in words[len(name.split()):]:
        if word.startswith("--"):
            assert word.split("=")[0] in taken, f"{doc.name}: {name} takes no {word}"


def test_shell_blocks_name_veracity_and_make_commands() -> None:
    # the checks below have something to check: the guides' commands are found
    assert len(VERACITY_LINES) >= 30
    assert any("replay" in line for _, line in VERACITY_LINES)  # inside $(...) and a loop
    assert any(line.startswith("veracity server") and "VERACITY_APP" not in line
               for p, line in VERACITY_LINES if p.name == "workflows.md")
    assert {line.split()[1] for _, line in MAKE_LINES} >= {"run", "test", "mutation"}


@pytest.mark.parametrize(("doc", "line"), MAKE_LINES,
                         ids=[f"{p.name}:{i}" for i, (p, _) in enumerate(MAKE_LINES)])
def test_make_commands_in_examples_are_targets_of_the_makefile(doc: Path, line: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    # a variable with a default (SEED ?= 1) or one the recipes read ($(MODULES))
    variables = set(re.findall(r"^([A-Z]+) \?=|\$\(([A-Z]+)\)", makefile, flags=re.M))
    variables = {name for pair in variables for name in pair if name}
    for word in shlex.split(line)[1:]:
        if "=" in word:
            assert word.split("=")[0] in variables, f"{doc.name}: make takes no {word}"
        else:
            assert word in targets, f"{doc.name}: no make target {word}"


@pytest.mark.parametrize(("doc", "line"), CURL_LINES,
                         ids=[f"{p.name}:{i}" for i, (p, _) in enumerate(CURL_LINES)])
def test_curl_examples_name_routes_the_api_serves(doc: Path, line: str) -> None:
    words = shlex.split(line)
    method = "GET"
    if "-XPOST" in words or ("-X" in words and words[words.index("-X") + 1] == "POST"):
        method = "POST"
    if "-XPUT" in words or ("-X" in words and words[words.index("-X") + 1] == "PUT"):
        method = "PUT"
    url = next(w for w in words if "localhost" in w or "127.0.0.1" in w)
    url = url.split("://", 1)[-1]
    path = "/" + url.split("/", 1)[1] if "/" in url else "/"
    path = path.split("?")[0]
    paths = create_api().openapi()["paths"]
    matching = [p for p in paths if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path)]
    assert matching, f"{doc.name}: no route for {path}"
    assert any(method.lower() in paths[p] for p in matching), f"{doc.name}: {method} {path}"


def test_the_readme_lists_exactly_the_fields_of_an_execution() -> None:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"An execution is `\{([^}]*)\}`", text, flags=re.S)
    assert match, "the README no longer lists an execution's fields"
    listed = [f.strip() for f in match.group(1).replace("\n", " ").split(",")]
    assert listed == list(ExecutionOut.model_fields), (
        "README.md's field list and ExecutionOut differ: "
        f"{sorted(set(listed) ^ set(ExecutionOut.model_fields))}")


def test_the_default_step_retry_policy_is_the_one_the_guides_give() -> None:
    """docs/workers.md writes the default out; docs/workflows.md says what it waits."""
    from veracity.core.retry import RetryPolicy
    from veracity.worker.context import DEFAULT_STEP_RETRY

    text = " ".join((ROOT / "docs" / "workers.md").read_text().split())
    written = re.search(r"Retries: `(RetryPolicy\([^`]*\))` is the default for `ctx.step`",
                        text)
    assert written, "docs/workers.md no longer writes the default policy out"
    assert eval(written.group(1), {"RetryPolicy": RetryPolicy}) == DEFAULT_STEP_RETRY
    guide = " ".join((ROOT / "docs" / "workflows.md").read_text().split())
    assert (f"{DEFAULT_STEP_RETRY.max_attempts} tries, waiting about 1, 2, 4, 8 and 16 s "
            f"in between (±{DEFAULT_STEP_RETRY.jitter * 100:.0f} %)") in guide
    waits = [DEFAULT_STEP_RETRY.delay(n, 0.5) for n in range(1, DEFAULT_STEP_RETRY.max_attempts)]
    assert [round(w) for w in waits] == [1, 2, 4, 8, 16]


CURL_BODIES = [(p, line) for p, line in CURL_LINES if " -d " in line]


@pytest.mark.parametrize(("doc", "line"), CURL_BODIES,
                         ids=[f"{p.name}:{i}" for i, (p, _) in enumerate(CURL_BODIES)])
async def test_curl_bodies_are_taken_by_their_route(doc: Path, line: str,
                                                    tmp_path: Path) -> None:
    """Each curl's JSON body, sent to its route of an API on a real store (``<id>`` an
    execution of it), is not refused as input (422): its fields are the route's."""
    words = shlex.split(line)
    body = json.loads(words[words.index("-d") + 1])
    url = next(w for w in words if "localhost" in w or "127.0.0.1" in w)
    store = await open_store(f"sqlite:///{tmp_path}/v.db")
    try:
        await store.migrate()
        service = ExecutionService(store, workflows=set(shop.app.workflows),
                                   deployment_id="d-doc")
        execution, _ = await service.submit("shop:orders/process.run", ["o-1", 1])
        path = "/" + url.split("://", 1)[-1].split("/", 1)[1].replace("<id>", str(execution.id))
        transport = httpx.ASGITransport(app=create_api(service), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answer = await client.request("POST" if "POST" in line else "PUT", path, json=body)
        assert answer.status_code != 422, (doc.name, answer.text)
        assert answer.status_code < 500, (doc.name, answer.text)
    finally:
        await store.close()
