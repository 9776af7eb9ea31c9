"""The Wait-node trap: n8n sets stoppedAt on a run parked in a Wait node (status waiting)
and keeps the old stoppedAt for a few seconds after a resume (status running). Neither is a
finished run: engine finished = stoppedAt set AND a terminal status."""

from __future__ import annotations

import asyncio

import pytest

from tests.reconciler._support import FAST, FAST_LIMIT, SLOW, V1, V2, Rig, wait_status
from veracity.core.states import Status
from veracity.testing.fake_n8n import WAIT_INDEFINITELY, FakeN8n, Script, Wait, Work, iso

pytestmark = pytest.mark.timeout(60)

BREACH_WAIT = FAST_LIMIT + 0.25


def parked(**kw: object) -> Script:
    """Parks at once in a Wait node for a webhook (waiting, stoppedAt set, waitTill 3000),
    then works for ever after a resume."""
    return Script(steps=(Wait(None, stale_stopped_for=30.0), Work(None)), outcome="keep_running",
                  callback="lose", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("fake", [V1, V2], indirect=True)
async def test_waiting_run_past_its_limit_is_stopped_remotely_not_just_marked(
    rig: Rig, fake: FakeN8n
) -> None:
    s = await rig.start(parked(), FAST)
    truth = await wait_status(rig, s.run_id, "waiting")
    shown = fake.execution(str(s.run_id))
    assert shown is not None
    assert shown["stoppedAt"] is not None and shown["waitTill"] == iso(WAIT_INDEFINITELY)
    assert truth.going
    await asyncio.sleep(BREACH_WAIT)

    result = await rig.tick()

    assert result.stops_requested == 1
    truth = rig.truth(s.run_id)
    assert [r.outcome for r in truth.stop_requests] == ["stopped"], (
        "a waiting run past its limit must be stopped in the engine, not just marked")
    assert truth.status == "canceled" and not truth.going
    e = await rig.get(s.id)
    assert e.status == Status.FAILED_TRANSIENT
    terminal = await rig.terminal_events(s.id)
    assert len(terminal) == 1
    assert isinstance(terminal[0].data, dict) and terminal[0].data["stop"] == "ok"
    await rig.assert_truthful()


async def test_waiting_run_past_its_limit_whose_stop_fails_stays_running(rig: Rig) -> None:
    s = await rig.start(parked(stop_failures=100), FAST)
    await wait_status(rig, s.run_id, "waiting")
    await asyncio.sleep(BREACH_WAIT)
    for _ in range(2):
        result = await rig.tick()
        assert result.stops_requested == 1 and result.actions == []
        assert (await rig.get(s.id)).status == Status.RUNNING
    truth = rig.truth(s.run_id)
    assert [r.outcome for r in truth.stop_requests] == ["failed", "failed"]
    assert truth.status == "waiting" and truth.going
    assert rig.engine_errors("stop_failed") == 2
    await rig.assert_truthful()


async def test_waiting_run_within_its_limit_is_left_alone(rig: Rig) -> None:
    s = await rig.start(parked(), SLOW)
    await wait_status(rig, s.run_id, "waiting")
    for _ in range(3):
        result = await rig.tick()
        assert result.examined == 1 and result.actions == [] and result.stops_requested == 0
        assert result.engine_errors == 0
    e = await rig.get(s.id)
    assert e.status == Status.RUNNING and e.flagged_at is None
    truth = rig.truth(s.run_id)
    assert truth.stop_requests == () and truth.status == "waiting" and truth.going
    await rig.assert_truthful()


async def test_timed_wait_that_parks_is_not_finished(rig: Rig) -> None:
    # a timed Wait long enough to park (waitTill a real time, not year 3000)
    script = Script(steps=(Wait(3600.0),), outcome="success", callback="lose")
    s = await rig.start(script, SLOW)
    await wait_status(rig, s.run_id, "waiting")
    result = await rig.tick()
    assert result.actions == []
    assert (await rig.get(s.id)).status == Status.RUNNING
    await rig.assert_truthful()


async def test_just_resumed_run_with_stale_stopped_at_is_not_finished(rig: Rig) -> None:
    s = await rig.start(parked(), SLOW)
    await wait_status(rig, s.run_id, "waiting")
    rig.fake.resume(str(s.run_id))
    shown = rig.fake.execution(str(s.run_id))
    assert shown is not None
    assert shown["status"] == "running" and shown["stoppedAt"] is not None, shown

    result = await rig.tick()

    assert result.actions == [] and result.stops_requested == 0 and result.engine_errors == 0
    e = await rig.get(s.id)
    assert e.status == Status.RUNNING and e.flagged_at is None
    assert rig.truth(s.run_id).going
    await rig.assert_truthful()


async def test_just_resumed_run_past_its_limit_is_stopped_not_ended_locally(rig: Rig) -> None:
    s = await rig.start(parked(), FAST)
    await wait_status(rig, s.run_id, "waiting")
    rig.fake.resume(str(s.run_id))
    await asyncio.sleep(BREACH_WAIT)
    shown = rig.fake.execution(str(s.run_id))
    assert shown is not None and shown["status"] == "running" and shown["stoppedAt"]

    result = await rig.tick()

    assert result.stops_requested == 1
    assert [r.outcome for r in rig.truth(s.run_id).stop_requests] == ["stopped"]
    assert (await rig.get(s.id)).status == Status.FAILED_TRANSIENT
    await rig.assert_truthful()


async def test_limit_is_measured_from_veracitys_trigger_not_the_engines_started_at(
    rig: Rig,
) -> None:
    # n8n rewrites startedAt at every resume: a run resumed just now still breached its
    # limit counted from Veracity's own trigger time
    s = await rig.start(parked(), FAST)
    await wait_status(rig, s.run_id, "waiting")
    await asyncio.sleep(BREACH_WAIT)
    rig.fake.resume(str(s.run_id))
    shown = rig.fake.execution(str(s.run_id))
    assert shown is not None and shown["startedAt"] > shown["createdAt"]
    result = await rig.tick()
    assert result.stops_requested == 1
    assert (await rig.get(s.id)).status == Status.FAILED_TRANSIENT
    await rig.assert_truthful()
