"""The engine's callbacks, POST /v1/executions/{id}/complete and /fail, authenticated by the
per-execution token the trigger sent: delivered for real by the fake over loopback to a served
API, and sent by hand (in-process API) for the bad inputs and for the race with the
reconciler."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from tests.reconciler._support import (
    FAST,
    FAST_LIMIT,
    SLOW,
    Rig,
    Started,
    callback_token,
    eventually,
    wait_status,
)
from tests.reconciler.conftest import MakeRig
from veracity.core.states import Status
from veracity.store import token_hash
from veracity.testing.fake_n8n import Script, Work

pytestmark = pytest.mark.timeout(60)

RESULT = {"order": 42, "items": ["a", "b"], "note": "ünïcode"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def finished_run(rig: Rig, ffqn: str = SLOW) -> tuple[Started, str]:
    """A run the engine finished whose callback has not arrived (yet)."""
    s = await rig.start(Script(steps=(Work(0.02),), outcome="success", callback="lose"), ffqn)
    await wait_status(rig, s.run_id, "success")
    return s, callback_token(rig, s.run_id)


# -- delivered by the fake itself ------------------------------------------------------------


async def test_engine_completion_delivered_over_http(make_rig: MakeRig, api_url: str) -> None:
    rig = await make_rig(public_url=api_url)
    s = await rig.start(Script(steps=(Work(0.05),), outcome="success", result=RESULT,
                               callback="duplicate"))
    attempts = await asyncio.to_thread(rig.fake.wait_for_callbacks, 2, 10.0)
    assert [(a.kind, a.status_code) for a in attempts] == [("complete", 200), ("complete", 200)]
    assert attempts[0].url == f"{api_url}/v1/executions/{s.id}/complete"
    e = await rig.get(s.id)
    assert e.status == Status.COMPLETED and e.result == RESULT
    kinds = await rig.kinds(s.id)
    assert kinds.count("completed") == 1 and "late_report" not in kinds, kinds
    # the reconciler leaves a completed execution alone
    assert (await rig.tick()).examined == 0
    await rig.assert_truthful()


@pytest.mark.parametrize("transient", [None, False, True])
async def test_engine_failure_delivered_over_http(make_rig: MakeRig, api_url: str,
                                                  transient: bool | None) -> None:
    rig = await make_rig(public_url=api_url)
    s = await rig.start(Script(steps=(Work(0.05),), outcome="error", error={"node": "HTTP"},
                               transient=transient, callback="duplicate"))
    attempts = await asyncio.to_thread(rig.fake.wait_for_callbacks, 2, 10.0)
    assert [(a.kind, a.status_code) for a in attempts] == [("fail", 200), ("fail", 200)]
    e = await rig.get(s.id)
    assert e.status == (Status.FAILED_TRANSIENT if transient else Status.FAILED)
    assert e.error == {"node": "HTTP"} and e.result is None
    assert len(await rig.terminal_events(s.id)) == 1
    assert "late_report" not in await rig.kinds(s.id)
    await rig.assert_truthful()


# -- by hand ---------------------------------------------------------------------------------


async def test_complete_then_repeats_and_a_late_fail(rig: Rig, client: httpx.AsyncClient
                                                     ) -> None:
    s, token = await finished_run(rig)
    url = f"/v1/executions/{s.id}"

    first = await client.post(f"{url}/complete", json={"result": RESULT}, headers=bearer(token))
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "completed" and first.json()["result"] == RESULT
    seen = await rig.history(s.id)

    again = await client.post(f"{url}/complete", json={"result": RESULT},
                              headers=bearer(token))
    assert again.status_code == 200, again.text
    assert again.json() == first.json(), "a repeat changes nothing"
    assert await rig.history(s.id) == seen

    late = await client.post(f"{url}/fail", json={"error": {"why": "late"}},
                             headers=bearer(token))
    assert late.status_code == 409, late.text
    assert late.json()["error"]["code"] == "already_ended"
    other = await client.post(f"{url}/complete", json={"result": {"different": 1}},
                              headers=bearer(token))
    assert other.status_code == 409, other.text

    e = await rig.get(s.id)
    assert e.status == Status.COMPLETED and e.result == RESULT
    # the token is stored hashed only
    assert e.callback_token_hash == token_hash(token) and token not in repr(e)
    history = await rig.history(s.id)
    late_reports = [ev.data for ev in history if ev.kind == "late_report"]
    assert len(late_reports) == 2
    assert isinstance(late_reports[0], dict) and late_reports[0]["report"] == "fail"
    assert late_reports[0]["payload"] == {"why": "late"}
    assert isinstance(late_reports[1], dict) and late_reports[1]["payload"] == {"different": 1}
    assert [ev.kind for ev in history].count("completed") == 1
    await rig.assert_truthful()


BAD_AUTH: list[dict[str, str]] = [
    {},
    {"Authorization": "Bearer wrong-token"},
    {"Authorization": "Bearer "},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "wrong-token"},
]


async def test_wrong_or_missing_token_is_401_and_changes_nothing(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    s, _ = await finished_run(rig)
    before = await rig.get(s.id)
    history = await rig.history(s.id)
    for report, body in (("complete", {"result": RESULT}), ("fail", {"error": "x"})):
        for headers in BAD_AUTH:
            response = await client.post(f"/v1/executions/{s.id}/{report}", json=body,
                                         headers=headers)
            assert response.status_code == 401, (report, headers, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
    assert await rig.get(s.id) == before
    assert await rig.history(s.id) == history


async def test_another_executions_token_is_401(rig: Rig, client: httpx.AsyncClient) -> None:
    a, token_a = await finished_run(rig)
    b, _ = await finished_run(rig)
    response = await client.post(f"/v1/executions/{b.id}/complete", json={"result": 1},
                                 headers=bearer(token_a))
    assert response.status_code == 401
    assert (await rig.get(b.id)).status == Status.RUNNING
    assert (await rig.get(a.id)).status == Status.RUNNING


async def test_token_for_an_execution_never_delegated_is_401(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    execution, _ = await rig.submit_claim(SLOW)  # claimed, never triggered: no token
    response = await client.post(f"/v1/executions/{execution.id}/complete",
                                 json={"result": 1}, headers=bearer("anything"))
    assert response.status_code == 401


@pytest.mark.parametrize("report", ["complete", "fail"])
async def test_unknown_execution_is_404(client: httpx.AsyncClient, report: str) -> None:
    body = {"result": 1} if report == "complete" else {"error": 1}
    response = await client.post(f"/v1/executions/{uuid.uuid4()}/{report}", json=body,
                                 headers=bearer("some-token"))
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"


async def test_not_an_id_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/executions/not-a-uuid/complete", json={"result": 1},
                                 headers=bearer("t"))
    assert response.status_code == 400, response.text


@pytest.mark.parametrize("report", ["complete", "fail"])
async def test_body_over_the_payload_limit_is_413(
    rig: Rig, client: httpx.AsyncClient, report: str
) -> None:
    s, token = await finished_run(rig)
    big = "x" * 10_000
    body = {"result": big} if report == "complete" else {"error": big}
    response = await client.post(f"/v1/executions/{s.id}/{report}", json=body,
                                 headers=bearer(token))
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "payload_too_large"
    # streamed without a Content-Length: refused as well
    async def chunks() -> Any:
        yield b'{"result": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    streamed = await client.post(f"/v1/executions/{s.id}/{report}", content=chunks(),
                                 headers={**bearer(token), "Content-Type": "application/json"})
    assert streamed.status_code == 413, streamed.text
    e = await rig.get(s.id)
    assert e.status == Status.RUNNING
    assert "completed" not in await rig.kinds(s.id)


MALFORMED_COMPLETE: list[tuple[bytes, int]] = [
    (b"{not json", 422),
    (b"", 422),
    (b"[]", 422),
    (b'{"results": 1}', 422),
    (b'{"result": 1, "extra": 2}', 422),
]
MALFORMED_FAIL: list[dict[str, Any]] = [
    {"error": 1, "transient": "maybe"},
    {"error": 1, "transient": [True]},
    {"transient": True},
    {},
]


async def test_malformed_callbacks_are_refused(rig: Rig, client: httpx.AsyncClient) -> None:
    s, token = await finished_run(rig)
    history = await rig.history(s.id)
    for content, status in MALFORMED_COMPLETE:
        response = await client.post(
            f"/v1/executions/{s.id}/complete", content=content,
            headers={**bearer(token), "Content-Type": "application/json"})
        assert response.status_code == status, (content, response.text)
        assert "error" in response.json()
    for body in MALFORMED_FAIL:
        response = await client.post(f"/v1/executions/{s.id}/fail", json=body,
                                     headers=bearer(token))
        assert response.status_code == 422, (body, response.text)
    assert (await rig.get(s.id)).status == Status.RUNNING
    assert await rig.history(s.id) == history


# -- /complete racing the reconciler ------------------------------------------------------------


async def test_reconciler_first_then_late_complete(rig: Rig, client: httpx.AsyncClient) -> None:
    s, token = await finished_run(rig)
    result = await rig.tick()
    assert [a.kind for a in result.actions] == ["terminate"]

    late = await client.post(f"/v1/executions/{s.id}/complete", json={"result": RESULT},
                             headers=bearer(token))

    assert late.status_code == 409, late.text
    assert late.json()["error"]["state"] == "failed_transient"
    e = await rig.get(s.id)
    assert e.status == Status.FAILED_TRANSIENT and e.result is None
    history = await rig.history(s.id)
    assert [ev.kind for ev in await rig.terminal_events(s.id)] == ["failed_transient"]
    reports = [ev.data for ev in history if ev.kind == "late_report"]
    assert len(reports) == 1 and isinstance(reports[0], dict)
    assert reports[0]["report"] == "complete" and reports[0]["payload"] == RESULT
    await rig.assert_truthful()


async def test_complete_first_then_reconciler(rig: Rig, client: httpx.AsyncClient) -> None:
    s, token = await finished_run(rig)
    done = await client.post(f"/v1/executions/{s.id}/complete", json={"result": RESULT},
                             headers=bearer(token))
    assert done.status_code == 200
    result = await rig.tick()
    assert result.examined == 0 and result.actions == []
    e = await rig.get(s.id)
    assert e.status == Status.COMPLETED and e.result == RESULT
    assert [ev.kind for ev in await rig.terminal_events(s.id)] == ["completed"]
    await rig.assert_truthful()


@pytest.mark.parametrize("ffqn", [SLOW, FAST])
async def test_complete_arrives_while_the_tick_asks_the_engine(
    rig: Rig, client: httpx.AsyncClient, ffqn: str
) -> None:
    # the tick has read the execution as running and is waiting for the engine's answer
    # (finished) when the callback lands: the callback wins, the tick's terminate finds it
    # no longer running and writes nothing
    s, token = await finished_run(rig, ffqn)
    if ffqn == FAST:
        await asyncio.sleep(FAST_LIMIT + 0.25)
    rig.fake.control(str(s.run_id), get_delay=0.6)
    tick = asyncio.create_task(rig.tick())
    await eventually(lambda: rig.sample("veracity_reconciler_executions_examined_total") >= 1,
                     what="the tick reading the running execution")
    done = await client.post(f"/v1/executions/{s.id}/complete", json={"result": RESULT},
                             headers=bearer(token))
    assert done.status_code == 200, done.text
    assert not tick.done(), "the callback must land while the tick waits for the engine"
    result = await tick

    assert result.examined == 1 and result.actions == [], "nothing applied over completed"
    e = await rig.get(s.id)
    assert e.status == Status.COMPLETED and e.result == RESULT
    assert [ev.kind for ev in await rig.terminal_events(s.id)] == ["completed"]
    await rig.assert_truthful()


async def test_fail_callback_for_a_flagged_execution_ends_it(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    # the engine forgot the id (404, flagged), but its failure report still arrives
    s = await rig.start(Script.forever(callback="lose"), SLOW)
    token = callback_token(rig, s.run_id)
    rig.fake.forget(str(s.run_id))
    await rig.tick()
    assert (await rig.get(s.id)).flagged_at is not None
    response = await client.post(f"/v1/executions/{s.id}/fail", json={"error": "boom"},
                                 headers=bearer(token))
    assert response.status_code == 200, response.text
    assert (await rig.get(s.id)).status == Status.FAILED
    await rig.assert_truthful()


async def test_callback_that_beats_the_engines_id(make_rig: MakeRig, api_url: str) -> None:
    # a fast n8n run completes and calls back before the webhook's answer (with its id)
    # reaches the worker: the completion stands; the id arriving afterwards changes nothing
    rig = await make_rig(public_url=api_url)
    s = await rig.start(Script(steps=(), outcome="success", result=RESULT, respond_delay=0.5))
    assert s.outcome.startswith("started"), s.outcome
    attempts = rig.fake.callbacks()
    assert [(a.kind, a.status_code) for a in attempts] == [("complete", 200)]
    e = await rig.get(s.id)
    assert e.status == Status.COMPLETED and e.result == RESULT
    assert [ev.kind for ev in await rig.terminal_events(s.id)] == ["completed"]
    assert e.flagged_at is None
    # the id that came too late is not dropped: it is kept in history
    reports = [ev.data for ev in await rig.history(s.id) if ev.kind == "late_report"]
    assert reports == [{"report": "external_id", "by": "worker",
                        "payload": {"external_execution_id": s.run_id},
                        "reason": "execution is completed"}]
    assert (await rig.tick()).examined == 0
    await rig.assert_truthful()
