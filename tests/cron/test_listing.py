"""``GET /v1/crons`` and ``veracity crons``, on both backends: each entry with its last
slot, the execution that slot started and that execution's status, and the next slot."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._helpers import clocked_store_fixture
from tests.conftest import run_async
from tests.cron._support import APP, MAIL, ORDERS, write_config
from tests.test_server import VERACITY
from veracity.api import create_api
from veracity.clock import ManualClock
from veracity.control import ExecutionService
from veracity.core.cron import parse_cron_entries
from veracity.examples import shop
from veracity.maintenance.cron import CronService
from veracity.models import Claim, CronDefinition
from veracity.store import Store, open_store

T0 = datetime(2030, 1, 1, tzinfo=UTC)
ENTRIES: list[dict[str, Any]] = [
    {"name": "mail", "ffqn": MAIL, "schedule": "*/10 * * * * *",
     "params": ["ops@example.com", "hello"]},
    {"name": "nightly", "ffqn": ORDERS, "schedule": "30 2 * * *",
     "timezone": "Europe/Berlin", "catch_up": True, "params": ["o-1"]},
]
CRONS = parse_cron_entries(ENTRIES, workflows=set(shop.app.workflows))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


store = clocked_store_fixture()


@pytest.fixture
async def client(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    service = ExecutionService(store, workflows=set(shop.app.workflows), deployment_id="d",
                               crons=CRONS)
    transport = httpx.ASGITransport(app=create_api(service), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def test_the_api_lists_each_entry(store: Store, clock: ManualClock,
                                        client: httpx.AsyncClient) -> None:
    # configured, but no server has run them yet
    listed = await client.get("/v1/crons")
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"items": [
        {"name": "mail", "ffqn": MAIL, "schedule": "*/10 * * * * *", "timezone": "UTC",
         "params": ["ops@example.com", "hello"], "catch_up": False, "first_seen_at": None,
         "last_slot": None, "last_execution_id": None, "last_execution_status": None,
         "next_slot": "2030-01-01T00:00:10Z", "next_slot_local": "2030-01-01T00:00:10Z"},
        {"name": "nightly", "ffqn": ORDERS, "schedule": "30 2 * * *",
         "timezone": "Europe/Berlin", "params": ["o-1"], "catch_up": True,
         "first_seen_at": None, "last_slot": None, "last_execution_id": None,
         "last_execution_status": None, "next_slot": "2030-01-01T01:30:00Z",
         "next_slot_local": "2030-01-01T02:30:00+01:00"}]}
    cron = CronService(store, CRONS, deployment_id="d")
    await cron.run_once()
    clock.set(T0 + timedelta(seconds=25))
    tick = await cron.run_once()
    last = tick.started[-1]
    assert last.slot_at == T0 + timedelta(seconds=20)
    items = {i["name"]: i for i in (await client.get("/v1/crons")).json()["items"]}
    assert items["mail"]["first_seen_at"] == "2030-01-01T00:00:00Z"
    assert items["mail"]["last_slot"] == "2030-01-01T00:00:20Z"
    assert items["mail"]["last_execution_id"] == str(last.execution.id)
    assert items["mail"]["last_execution_status"] == "pending"
    assert items["mail"]["next_slot"] == "2030-01-01T00:00:30Z"
    assert items["nightly"]["last_slot"] is None
    assert items["nightly"]["first_seen_at"] == "2030-01-01T00:00:00Z"
    # the status is the execution's, now
    claimed = await store.execution_claim("w", [MAIL], limit=10,
                                          lease_ttl=timedelta(seconds=30))
    by_id = {e.id: e for e in claimed}
    e = by_id[last.execution.id]
    await store.execution_complete_if_owned(Claim(e.id, "w", e.lease_epoch), "sent")
    items = {i["name"]: i for i in (await client.get("/v1/crons")).json()["items"]}
    assert items["mail"]["last_execution_status"] == "completed"
    # the execution page agrees
    got = (await client.get(f"/v1/executions/{last.execution.id}")).json()
    assert got["status"] == "completed" and got["scheduled_at"] == "2030-01-01T00:00:20Z"
    history = (await client.get(f"/v1/executions/{last.execution.id}/history")).json()
    assert history["items"][0]["data"]["cron"]["slot"] == "2030-01-01T00:00:20+00:00"


async def test_an_entry_changed_since_the_servers_started(store: Store, clock: ManualClock
                                                         ) -> None:
    """The database recorded the entry with another schedule: its last slot is shown, but
    no server has run this schedule yet."""
    await store.cron_register([CronDefinition("mail", "0 * * * *", "UTC")])
    cron = CronService(store, parse_cron_entries([{**ENTRIES[0], "schedule": "0 * * * *"}],
                                                 workflows=set(shop.app.workflows)),
                       deployment_id="d")
    clock.set(T0 + timedelta(hours=1))
    (started,) = (await cron.run_once()).started
    service = ExecutionService(store, workflows=set(shop.app.workflows), deployment_id="d",
                               crons=CRONS)
    transport = httpx.ASGITransport(app=create_api(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        mail = (await c.get("/v1/crons")).json()["items"][0]
    assert mail["schedule"] == "*/10 * * * * *" and mail["first_seen_at"] is None
    assert mail["last_slot"] == "2030-01-01T01:00:00Z"
    assert mail["last_execution_id"] == str(started.execution.id)


async def test_no_entries_an_empty_list(store: Store) -> None:
    service = ExecutionService(store, workflows=set(shop.app.workflows), deployment_id="d")
    transport = httpx.ASGITransport(app=create_api(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        assert (await c.get("/v1/crons")).json() == {"items": []}


def cli(args: list[str], database_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERACITY_")}
    env.update(VERACITY_DATABASE_URL=database_url, VERACITY_APP=APP)
    return subprocess.run([VERACITY, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)


async def _fire_recent(database_url: str) -> tuple[str, datetime]:
    """Run the entries' service as a server would, on real time: the mail entry starts a
    slot; returns that slot's execution id and time."""
    now = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(now - timedelta(seconds=25))
    store = await open_store(database_url, clock=clock)
    try:
        cron = CronService(store, CRONS, deployment_id="d")
        await cron.run_once()
        clock.set(now)
        tick = await cron.run_once()
        last = tick.started[-1]
        return str(last.execution.id), last.slot_at
    finally:
        await store.close()


def test_the_cli_lists_each_entry(tmp_path: Path, database_url: str) -> None:
    write_config(tmp_path, *ENTRIES)
    execution_id, slot = run_async(_fire_recent(database_url))
    shown = cli(["crons", "--json"], database_url, tmp_path)
    assert shown.returncode == 0, shown.stderr
    items = {i["name"]: i for i in json.loads(shown.stdout)["items"]}
    assert list(items) == ["mail", "nightly"]
    mail = items["mail"]
    assert mail["last_execution_id"] == execution_id
    assert datetime.fromisoformat(mail["last_slot"]) == slot
    assert mail["last_execution_status"] == "pending"
    assert datetime.fromisoformat(mail["next_slot"]) > slot
    assert mail["params"] == ["ops@example.com", "hello"] and mail["catch_up"] is False
    assert items["nightly"]["timezone"] == "Europe/Berlin"
    assert items["nightly"]["next_slot_local"].endswith(("02:30:00+01:00", "02:30:00+02:00"))

    table = cli(["crons"], database_url, tmp_path)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "WORKFLOW", "SCHEDULE", "TIMEZONE", "LAST", "SLOT",
                                "EXECUTION", "STATUS", "NEXT", "SLOT", "NEXT", "SLOT",
                                "(LOCAL)"]
    mail_line = next(line for line in lines if line.startswith("mail "))
    assert execution_id in mail_line and "pending" in mail_line and MAIL in mail_line
    assert "*/10 * * * * *" in mail_line
    night_line = next(line for line in lines if line.startswith("nightly "))
    assert "Europe/Berlin" in night_line and " - " in night_line  # no slot yet


def test_the_cli_without_entries(tmp_path: Path, database_url: str) -> None:
    shown = cli(["crons"], database_url, tmp_path)
    assert (shown.returncode, shown.stdout) == (0, "no [[cron]] entries are configured\n")
    shown = cli(["crons", "--json"], database_url, tmp_path)
    assert json.loads(shown.stdout) == {"items": []}


async def test_the_dashboard_lists_each_entry_with_its_last_slot(
    store: Store, clock: ManualClock, client: httpx.AsyncClient
) -> None:
    page = await client.get("/ui/crons")
    assert page.status_code == 200
    text = " ".join(re.sub(r"<[^>]+>", " ", page.text).split())
    assert "mail " + MAIL + " */10 * * * * * UTC none yet" in text
    assert "nightly " + ORDERS + " 30 2 * * * Europe/Berlin none yet" in text
    assert "2030-01-01 01:30:00Z" in text  # nightly's next slot, in UTC
    cron = CronService(store, CRONS, deployment_id="d")
    await cron.run_once()
    clock.set(T0 + timedelta(seconds=25))
    last = (await cron.run_once()).started[-1]
    page = await client.get("/ui/crons")
    text = " ".join(re.sub(r"<[^>]+>", " ", page.text).split())
    assert "2030-01-01 00:00:20Z (5 s ago) pending" in text
    assert f'href="/ui/executions/{last.execution.id}"' in page.text
    assert "2030-01-01 00:00:30Z (in 5 s)" in text
