"""``public_url`` (``VERACITY_PUBLIC_URL``): how the engine reaches Veracity's callbacks. The
environment variable sets it and wins over the file's key, as every variable does; and it is
what the callback URLs in a trigger's body are made of — in-process and in a real
``veracity worker``."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.reconciler._support import (
    DEPLOYMENT,
    ENV,
    SLOW,
    Rig,
    config_toml,
    eventually,
)
from tests.worker._procs import Processes
from veracity.adapters.config import parse_external
from veracity.adapters.n8n import N8nEngine
from veracity.config import load_settings
from veracity.models import NewExecution
from veracity.store import Store
from veracity.testing.fake_n8n import FakeN8n, Script

pytestmark = pytest.mark.timeout(60)

FILE_URL = "http://from-the-file.example:8000"
ENV_URL = "https://from-the-env.example:9443/veracity"


def write_config(folder: Path, fake_url: str) -> Path:
    path = folder / "veracity.toml"
    path.write_text(config_toml(fake_url, FILE_URL))
    return path


def callback_block(fake: FakeN8n, execution_id: uuid.UUID) -> dict[str, Any]:
    [run] = fake.runs_for_execution(str(execution_id))
    body = run.trigger_body
    assert isinstance(body, dict) and body["execution_id"] == str(execution_id)
    callback: dict[str, Any] = body["callback"]
    return callback


def test_the_variable_sets_public_url_and_wins_over_the_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:5678")

    from_file = load_settings(config, env={})
    assert from_file.public_url == FILE_URL
    from_env = load_settings(config, env={"VERACITY_PUBLIC_URL": ENV_URL})
    assert from_env.public_url == ENV_URL
    assert parse_external(from_env, ENV).public_url == ENV_URL
    # a trailing slash is dropped: callback URLs never get a double slash
    slash = load_settings(config, env={"VERACITY_PUBLIC_URL": ENV_URL + "/"})
    assert parse_external(slash, ENV).public_url == ENV_URL
    # empty counts as unset: the file's key stays
    assert load_settings(config, env={"VERACITY_PUBLIC_URL": " "}).public_url == FILE_URL

    # without the file's key either: the variable alone, else this server's host and port
    bare = tmp_path / "bare.toml"
    bare.write_text(config.read_text().replace(f'public_url = "{FILE_URL}"\n', ""))
    assert parse_external(load_settings(bare, env={"VERACITY_PUBLIC_URL": ENV_URL}),
                          ENV).public_url == ENV_URL
    default = load_settings(bare, env={"VERACITY_HOST": "10.1.2.3", "VERACITY_PORT": "8123"})
    assert default.public_url is None
    assert parse_external(default, ENV).public_url == "http://10.1.2.3:8123"


async def test_the_variable_reaches_the_callback_urls_of_the_trigger(
    fake: FakeN8n, fake_url: str, store: Store, tmp_path: Path
) -> None:
    settings = load_settings(write_config(tmp_path, fake_url),
                             env={"VERACITY_PUBLIC_URL": ENV_URL})
    external = parse_external(settings, ENV)
    rig = Rig(fake, fake_url, store, external, N8nEngine(external.engines["n8n"]))
    try:
        started = await rig.start(Script.forever(callback="lose"), SLOW)
    finally:
        await rig.engine.aclose()
    assert started.outcome.startswith("started"), started.outcome
    callback = callback_block(fake, started.id)
    assert callback["complete_url"] == f"{ENV_URL}/v1/executions/{started.id}/complete"
    assert callback["fail_url"] == f"{ENV_URL}/v1/executions/{started.id}/fail"
    assert FILE_URL not in str(callback)


async def test_a_worker_process_gives_the_engine_the_variables_url(
    fake: FakeN8n, fake_url: str, store: Store, database_url: str, procs: Processes,
    tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake_url)
    eid = uuid.uuid4()
    await store.execution_submit(NewExecution(ffqn=SLOW, params=[{"order": "B-2"}],
                                              deployment_id=DEPLOYMENT, id=eid))
    worker = procs.worker(database_url, "worker", env={
        **ENV, "VERACITY_CONFIG": str(config), "VERACITY_PUBLIC_URL": ENV_URL})

    async def triggered() -> bool:
        found = await store.execution_get(eid)
        return found is not None and found.external_execution_id is not None

    await eventually(triggered, timeout=15, what="the worker triggering the run")
    assert worker.alive, worker.describe()
    callback = callback_block(fake, eid)
    assert callback["complete_url"] == f"{ENV_URL}/v1/executions/{eid}/complete"
    assert callback["fail_url"] == f"{ENV_URL}/v1/executions/{eid}/fail"
