"""Cron with real ``veracity server`` processes: a slot starts exactly once with two
servers on one PostgreSQL database (a 6-field schedule firing every second, run for a few
seconds, every slot between the first and the last counted in the database; docs/cron.md,
"Many servers"); and a server starting after a downtime fires only the latest missed slot,
or with catch_up every one, on both backends ("Missed slots")."""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_async
from tests.cron._support import MAIL, executions, slot_of, write_config
from tests.test_server import free_port, server_env, server_process
from veracity.clock import ManualClock
from veracity.models import CronDefinition
from veracity.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_each_slot_starts_once_with_two_servers(tmp_path: Path, pg_url: str) -> None:
    config = write_config(tmp_path, {"name": "every_second", "ffqn": MAIL,
                                     "schedule": "* * * * * *",
                                     "params": ["ops@example.com", "tick"]})
    folders = [tmp_path / "a", tmp_path / "b"]
    ports = [free_port(), free_port()]
    for folder in folders:
        folder.mkdir()
    envs = [server_env(pg_url, port, VERACITY_CONFIG=str(config), VERACITY_LOG_LEVEL="info")
            for port in ports]
    with server_process(folders[0], envs[0], ports[0]) as a, \
            server_process(folders[1], envs[1], ports[1]) as b:
        for server in (a, b):
            server.wait_healthy()
        # both serve now: let at least five more slots pass
        started = len(executions(pg_url))
        deadline = time.monotonic() + 20
        while len(executions(pg_url)) < started + 5:
            assert time.monotonic() < deadline, (a.stderr()[-2000:], b.stderr()[-2000:])
            time.sleep(0.3)
        with httpx.Client(timeout=5) as client:
            texts = [client.get(f"{s.url}/metrics").text for s in (a, b)]
            listed = [client.get(f"{s.url}/v1/crons").json()["items"] for s in (a, b)]
        for server in (a, b):
            server.proc.send_signal(signal.SIGTERM)
        for server in (a, b):
            assert server.proc.wait(timeout=15) == 0, server.stderr()[-2000:]

    found = executions(pg_url)
    slots = [slot_of(events) for _, events in found]
    per_slot = Counter(slots)
    assert all(n == 1 for n in per_slot.values()), per_slot.most_common(3)
    times = sorted(at for _, at in per_slot)
    # no slot missed between the first and the last
    assert times == [times[0] + timedelta(seconds=i) for i in range(len(times))], times
    for execution, events in found:
        assert execution.ffqn == MAIL and execution.params == ["ops@example.com", "tick"]
        assert execution.scheduled_at == slot_of(events)[1]
        assert [e.kind for e in events][:1] == ["pending"]
    # every start was logged, as JSON, by the server that made it
    logged = [r for s in (a, b) for r in s.log_lines()
              if r.get("domain") == "cron" and r.get("execution_id")]
    assert sorted(r["execution_id"] for r in logged) == sorted(str(e.id) for e, _ in found)
    # both servers ran cron ticks; what they started adds up to one per slot so far
    for text in texts:
        assert metric(text, 'veracity_cron_ticks_total{outcome="ran"}') >= 2
    assert sum(metric(t, "veracity_cron_slots_fired_total") for t in texts) <= len(found)
    # both list the entry with the same truth (a slot may have started between the reads)
    assert [item["name"] for item in listed[0]] == ["every_second"] == \
        [item["name"] for item in listed[1]]
    assert {item["last_execution_status"] for items in listed for item in items} <= {
        "pending", "running", "completed"}


async def _first_seen_an_hour_ago(url: str, catch_up: bool) -> datetime:
    """The entry as a server running an hour ago recorded it; then every server went down."""
    now = datetime.now(UTC)
    store = await open_store(url, clock=ManualClock(now - timedelta(hours=1)))
    try:
        await store.cron_register([CronDefinition("minutely", "* * * * *", "UTC")])
    finally:
        await store.close()
    return now


@pytest.mark.parametrize("catch_up", [False, True], ids=["latest-only", "catch-up"])
def test_after_downtime_a_starting_server_fires_what_was_missed(
    tmp_path: Path, database_url: str, catch_up: bool
) -> None:
    config = write_config(tmp_path, {"name": "minutely", "ffqn": MAIL,
                                     "schedule": "* * * * *", "catch_up": catch_up,
                                     "params": ["ops@example.com", "missed"]})
    down_since = run_async(_first_seen_an_hour_ago(database_url, catch_up))
    port = free_port()
    env = server_env(database_url, port, VERACITY_CONFIG=str(config),
                     VERACITY_LOG_LEVEL="info")
    with server_process(tmp_path, env, port) as server:
        server.wait_healthy()
        deadline = time.monotonic() + 20
        while not executions(database_url):
            assert time.monotonic() < deadline, server.stderr()[-2000:]
            time.sleep(0.2)
        time.sleep(0.5)  # anything more it would start in the same tick is written by now
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=15) == 0, server.stderr()[-2000:]
    found = executions(database_url)
    slots = [slot_of(events)[1] for _, events in found]
    minutes = [down_since.replace(second=0, microsecond=0) - timedelta(minutes=i)
               for i in range(59, -1, -1)]  # the 60 whole minutes since the downtime began
    if catch_up:
        assert slots[:60] == minutes, slots
        assert all(events[0].data["cron"].get("missed") for _, events in found[:59])
        later = slots[60:]
    else:
        # the latest slot due when it first ticked: the last minute of the downtime, or the
        # one after if a minute began while it started; every older one skipped
        first = slots[0]
        assert first in (minutes[-1], minutes[-1] + timedelta(minutes=1)), slots
        skipped = [r for r in server.log_lines() if r.get("skipped") is not None]
        expected = len([m for m in minutes if m < first])
        assert [(r["cron"], r["skipped"]) for r in skipped] == [("minutely", expected)]
        later = slots[1:]
    # a slot that came due while the server ran may follow, each once
    assert len(slots) == len(set(slots)) and all(s > minutes[-1] for s in later)
