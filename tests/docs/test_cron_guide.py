"""docs/cron.md promises complete, runnable examples, and states its rules with examples:
run them and check each one (the app and configuration, the commands, the history event,
the listing, the error lines, the DST table)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_server import VERACITY, free_port, server_process
from veracity.clock import ManualClock
from veracity.config import WorkerSettings, load_settings
from veracity.core.cron import Schedule, parse_cron_entries
from veracity.core.states import Status
from veracity.errors import ConfigError
from veracity.maintenance.cron import CronService
from veracity.runtime import load_user_app, shapes_of
from veracity.store import open_store
from veracity.worker.runner import Worker

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "cron.md"
TEXT = GUIDE.read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", TEXT, flags=re.S)


@pytest.fixture
def guide(tmp_path: Path) -> Iterator[Path]:
    """The guide's app as reports.py and its configuration as veracity.toml, in a folder
    of their own (importable while the test runs)."""
    (app,) = blocks("python")
    (config,) = blocks("toml")
    (tmp_path / "reports.py").write_text(app)
    (tmp_path / "veracity.toml").write_text(config)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("reports", None)


def entries_of(folder: Path, toml: str | None = None) -> Any:
    path = folder / "veracity.toml"
    if toml is not None:
        path.write_text(toml)
    settings = load_settings(path, env={})
    app = load_user_app(settings)
    assert app is not None
    return parse_cron_entries(settings.cron, workflows=set(app.workflows),
                              max_payload_bytes=settings.max_payload_bytes,
                              shapes=shapes_of(app))


def test_the_commands_run(guide: Path) -> None:
    """The shell block, as written: the server runs the entries, the listing shows them."""
    (sh,) = blocks("sh")
    commands = [line.split("#")[0].strip() for line in sh.splitlines() if line.strip()]
    assert commands == ["PYTHONPATH=. veracity server", "PYTHONPATH=. veracity crons"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env.update(PYTHONPATH=".", VERACITY_PORT=str(free_port()))
    port = int(env["VERACITY_PORT"])
    with server_process(guide, env, port) as server:
        server.wait_healthy()
        listed = httpx.get(f"{server.url}/v1/crons", timeout=5).json()["items"]
        assert [i["name"] for i in listed] == ["daily_summary", "ping"]
        shown = subprocess.run([VERACITY, "crons"], env=env, cwd=guide, capture_output=True,
                               text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith("NAME")
    assert "daily_summary" in shown.stdout and "*/15 * * * * *" in shown.stdout
    assert all(i["first_seen_at"] for i in listed)  # the server recorded them at start


@pytest.mark.timeout(60)
async def test_the_entries_start_their_workflows(guide: Path, database_url: str) -> None:
    crons = entries_of(guide)
    assert [(c.name, c.timezone, c.catch_up, c.params) for c in crons] == [
        ("daily_summary", "Europe/Berlin", True, ("platform",)),
        ("ping", "UTC", False, ())]
    reports = importlib.import_module("reports")  # the guide's app, written by the fixture

    clock = ManualClock(datetime(2030, 1, 7, 6, 0, tzinfo=UTC))  # a Monday, 07:00 in Berlin
    store = await open_store(database_url, clock=clock)
    try:
        cron = CronService(store, crons, deployment_id="d-doc")
        await cron.run_once()
        clock.set(datetime(2030, 1, 7, 6, 30, 2, tzinfo=UTC))
        tick = await cron.run_once()
        started = {(f.name, f.slot_at) for f in tick.started}
        assert ("daily_summary", datetime(2030, 1, 7, 6, 30, tzinfo=UTC)) in started
        assert ("ping", datetime(2030, 1, 7, 6, 30, tzinfo=UTC)) in started
        daily = next(f for f in tick.started if f.name == "daily_summary")
        (event,) = await store.history_list(daily.execution.id)
        documented = json.loads(next(b for b in blocks("json") if '"cron"' in b
                                     and '"items"' not in b))
        assert sorted(event.data) == sorted(documented)
        assert event.data["deployment_id"] == "d-doc"  # the server's; the guide shows a digest
        assert {**event.data, "deployment_id": documented["deployment_id"]} == documented
        worker = Worker(store, reports.app, deployment_id="d-doc", settings=WorkerSettings(
            lease_ttl=30, heartbeat_interval=1, poll_interval=0.05, concurrency=4))
        task = asyncio.create_task(worker.run())
        try:
            results = {}
            for f in tick.started:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                while True:
                    e = await store.execution_get(f.execution.id)
                    assert e is not None
                    if e.status.is_terminal:
                        break
                    assert loop.time() < deadline, e
                    await asyncio.sleep(0.05)
                assert e.status == Status.COMPLETED, e.error
                results[f.name] = e.result
            assert results == {"daily_summary": "summary for platform", "ping": "pong"}
        finally:
            worker.stop()
            await task
    finally:
        await store.close()


def test_the_listing_example_has_the_fields_of_the_api(guide: Path) -> None:
    from veracity.api.schemas import CronOut

    (listing,) = [b for b in blocks("json") if '"items"' in b]
    (item,) = json.loads(listing)["items"]
    assert list(item) == list(CronOut.model_fields)
    (daily, _) = entries_of(guide)
    assert (item["name"], item["ffqn"], item["schedule"], item["timezone"], item["params"],
            item["catch_up"]) == (daily.name, daily.ffqn, daily.expression, daily.timezone,
                                  list(daily.params), daily.catch_up)
    last = datetime.fromisoformat(item["last_slot"])
    assert daily.schedule.next_after(last) == datetime.fromisoformat(item["next_slot"])
    assert daily.schedule.local(datetime.fromisoformat(item["next_slot"])) == \
        datetime.fromisoformat(item["next_slot_local"])


def test_the_error_lines_are_the_servers(guide: Path) -> None:
    (errors,) = re.findall(r"^```\n(error:.*?)^```", TEXT, flags=re.S | re.M)
    lines = [line.removeprefix("error: ") for line in errors.splitlines()]
    config = (guide / "veracity.toml").read_text()
    ping = config[config.index("[[cron]]\nname = \"ping\""):]
    changes = [
        config.replace('schedule = "30 7 * * MON-FRI"', 'schedule = "61 * * * *"'),
        config.replace('ffqn = "reports:daily/summary.run"',
                       'ffqn = "reports:daily/nothing.run"'),
        config.replace('"Europe/Berlin"', '"Europe/Atlantis"'),
        config + "\n" + ping,
        config + 'params = "x"\n',
        config + 'every = "15s"\n',
        config.replace('params = ["platform"]', "params = []"),
    ]
    assert len(lines) == len(changes)
    for line, toml in zip(lines, changes, strict=True):
        with pytest.raises(ConfigError) as caught:
            entries_of(guide, toml)
        assert str(caught.value) == line
    tomllib.loads(config)  # the configuration itself is valid TOML


def test_the_dst_table(guide: Path) -> None:
    rows = re.findall(r"^\| `([^`]+)` \| (.+?) \| (.+?) \|$", TEXT, flags=re.M)
    rows = [r for r in rows if len(r[0].split()) in (5, 6)]
    assert len(rows) == 4
    berlin = "Europe/Berlin"
    nights = [(datetime(2030, 3, 30, 23, 30, tzinfo=UTC), datetime(2030, 3, 31, 2, 30,
                                                                     tzinfo=UTC)),
              (datetime(2030, 10, 26, 22, 30, tzinfo=UTC), datetime(2030, 10, 27, 3, 30,
                                                                      tzinfo=UTC))]
    for expression, *cells in rows:
        schedule = Schedule(expression, berlin)
        for (start, end), cell in zip(nights, cells, strict=True):
            # 00:30 to 04:30 local those nights
            assert schedule.local(start).strftime("%H:%M") == "00:30"
            assert schedule.local(end).strftime("%H:%M") == "04:30"
            got: list[str] = []
            t: datetime | None = schedule.next_after(start)
            while t is not None and t <= end:
                got.append(schedule.local(t).strftime("%H:%M%z"))
                t = schedule.next_after(t)
            text = re.sub(r"\s*\([^)]*\)", "", cell)
            # "03:00+02:00" as strftime's "%H:%M%z" writes it: "03:00+0200"
            wanted = [] if text == "none" else [w[:5] + w[5:].replace(":", "")
                                                for w in text.split(", ")]
            assert got == wanted, (expression, cell, got)


def test_the_next_slot_of_the_listing_is_a_weekday_morning(guide: Path) -> None:
    daily = entries_of(guide)[0]
    friday = datetime(2030, 1, 11, 7, 0, tzinfo=UTC)  # 08:00 in Berlin, after 07:30
    assert daily.schedule.next_after(friday) == datetime(2030, 1, 14, 6, 30, tzinfo=UTC)
    assert daily.schedule.next_after(friday - timedelta(hours=1)) == friday - timedelta(
        minutes=30)
