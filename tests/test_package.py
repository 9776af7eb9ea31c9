"""The public surface of ``import veracity``: exactly ``__all__``, each name loading on
first use from the module that defines it (so importing the package stays quick)."""

from __future__ import annotations

import subprocess
import sys
import types

import veracity


def test_the_public_names_are_exactly_all() -> None:
    assert sorted(veracity.__all__) == sorted(veracity._WHERE)
    for name in veracity.__all__:
        value = getattr(veracity, name)
        assert value.__module__ == veracity._WHERE[name], name
    public = {n for n in dir(veracity) if not n.startswith("_")
              and not isinstance(getattr(veracity, n), types.ModuleType)}
    assert public - {"annotations", "import_module", "TYPE_CHECKING", "Any"} == set(
        veracity.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        veracity.Nope  # noqa: B018
    except AttributeError as exc:
        assert "Nope" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_importing_veracity_loads_neither_the_server_nor_the_database_drivers() -> None:
    code = ("import sys, veracity; from veracity import App, Context, Client; "
            "print(sorted(m for m in ('psycopg', 'fastapi', 'uvicorn', 'veracity.store', "
            "'veracity.worker.runner', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_veracity_version_answers_without_loading_the_commands() -> None:
    """`veracity --version` prints what click's version option prints, from the console
    script's entry point alone (veracity.cli.main and what it imports stay unloaded)."""
    from click.testing import CliRunner

    from veracity.cli.main import cli

    expected = CliRunner().invoke(cli, ["--version"], prog_name="veracity").output
    code = ("import sys; sys.argv = ['veracity', '--version']; import veracity.cli; "
            "veracity.cli.main(); print(sorted(m for m in ('veracity.cli.main', 'click', "
            "'pydantic', 'psycopg', 'fastapi', 'veracity.store') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout == expected + "[]\n", out.stdout


def test_the_cli_package_still_names_the_click_group() -> None:
    import veracity.cli
    from veracity.cli.main import cli

    assert veracity.cli.cli is cli
    try:
        veracity.cli.nope  # noqa: B018
    except AttributeError as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_the_cli_reads_the_api_schemas_without_the_web_framework() -> None:
    # nor PostgreSQL's driver: a command on SQLite never loads it (veracity/grouping.py
    # tells its errors apart without importing it)
    code = ("import sys, veracity.api.schemas, veracity.control; "
            "print(sorted(m for m in ('fastapi', 'aiohttp', 'veracity.adapters.n8n', "
            "'psycopg') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_worker_starts_without_the_web_stack() -> None:
    """What `veracity worker` imports before its first claim (bench/startup.py times it):
    neither the web framework nor an HTTP client (ctx.http's loads for the first execution
    run, an engine's adapter only when one is configured), nor the API's service and the
    cron parser, which a worker does not use (some 30 to 50 ms of its start-up), nor
    pydantic: the settings are validated by pydantic-core alone (veracity/_validated.py;
    pydantic's modules and models cost some 60 ms more), nor the Prometheus client,
    loaded only by a worker that serves its metrics (some 20 ms)."""
    code = ("import sys, veracity.cli.main, veracity.worker.main, veracity.worker.runner, "
            "veracity.store.postgres; "
            "print(sorted(m for m in ('fastapi', 'starlette', 'httpx', 'aiohttp', "
            "'veracity.api.schemas', 'veracity.adapters.n8n', 'veracity.control', "
            "'croniter', 'pydantic', 'prometheus_client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


WORKER_RUN = """
import asyncio, sys, tempfile
from veracity import App, Context
from veracity._ids import new_execution_id
from veracity.config import WorkerSettings
from veracity.models import NewExecution
from veracity.store import open_store
from veracity.worker.runner import Worker

app = App("t")

@app.workflow("t:plain/run.fn")
async def plain(ctx: Context, x: int) -> int:
    return x + 1

async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(f"sqlite:///{tmp}/v.db")
        await store.migrate()
        new = NewExecution(ffqn="t:plain/run.fn", params=[1], deployment_id="d",
                           id=new_execution_id())
        ex = (await store.execution_submit(new)).execution
        worker = Worker(store, app, settings=WorkerSettings(poll_interval=0.05),
                        deployment_id="d")
        task = asyncio.create_task(worker.run())
        for _ in range(500):
            got = await store.execution_get(ex.id)
            if got is not None and got.status == "completed":
                break
            await asyncio.sleep(0.02)
        worker.stop()
        await task
        await store.close()
        print(got.status if got else None, got.result if got else None,
              "httpx" in sys.modules)

asyncio.run(main())
"""


def test_a_worker_whose_workflows_never_use_ctx_http_never_loads_httpx() -> None:
    """Loading httpx (some 45 ms) was on the way to a worker's first execution's start:
    ``ctx.http`` is made when a workflow first uses it (tests/worker/test_http.py)."""
    out = subprocess.run([sys.executable, "-c", WORKER_RUN], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["completed", "2", "False"], (out.stdout, out.stderr)
