"""The fake n8n, exercised over real HTTP on loopback.

Timing-sensitive state (Wait nodes, stale stoppedAt, restarts) runs on a manual clock so the
assertions are exact; the end-to-end flows (callbacks, hangs, latency, the CLI) run on real time
with scripted durations of a few tenths of a second.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from veracity.clock import ManualClock
from veracity.testing import (
    FakeN8n,
    Script,
    Wait,
    Work,
    running,
    serve_asgi_in_thread,
    serve_in_thread,
)
from veracity.testing.fake_n8n import WAIT_INDEFINITELY, iso

KEY = "test-key"
H = {"X-N8N-API-KEY": KEY}
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SRC = str(Path(__file__).resolve().parents[2] / "src")


# --------------------------------------------------------------------------------------------
# A real HTTP receiver for callbacks


@dataclass
class Received:
    kind: str
    execution_id: str
    authorization: str | None
    body: Any
    at: datetime


@dataclass
class Receiver:
    base_url: str
    calls: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answers to give, in order; then 200
    lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, execution_id: str, token: str = "tok") -> dict[str, str]:
        return {
            "complete_url": f"{self.base_url}/v1/executions/{execution_id}/complete",
            "fail_url": f"{self.base_url}/v1/executions/{execution_id}/fail",
            "token": token,
        }

    def wait(self, count: int, timeout: float = 5.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.calls) >= count:
                    return list(self.calls)
            time.sleep(0.01)
        raise AssertionError(f"{len(self.calls)} callbacks received, wanted {count}")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    async def handle(request: Request) -> Response:
        rec = holder[0]
        body = json.loads(await request.body())
        with rec.lock:
            rec.calls.append(
                Received(
                    kind=request.path_params["kind"],
                    execution_id=request.path_params["eid"],
                    authorization=request.headers.get("authorization"),
                    body=body,
                    at=datetime.now(UTC),
                )
            )
            status = rec.statuses.pop(0) if rec.statuses else 200
        return JSONResponse({"ok": status == 200}, status_code=status)

    app = Starlette(routes=[Route("/v1/executions/{eid}/{kind}", handle, methods=["POST"])])
    base_url, stop = serve_asgi_in_thread(app)
    holder.append(Receiver(base_url))
    try:
        yield holder[0]
    finally:
        stop()


# --------------------------------------------------------------------------------------------
# Helpers


@dataclass
class Served:
    fake: FakeN8n
    base_url: str
    client: httpx.Client

    def trigger(
        self, path: str, execution_id: str, receiver: Receiver | None = None, **kw: Any
    ) -> httpx.Response:
        body: dict[str, Any] = {"execution_id": execution_id, "params": [1, "two"]}
        if receiver is not None:
            body["callback"] = receiver.callback(execution_id)
        return self.client.post(f"/webhook/{path}", json=body, **kw)

    def get(self, run_id: str, **kw: Any) -> httpx.Response:
        return self.client.get(f"/api/v1/executions/{run_id}", headers=H, **kw)

    def execution(self, run_id: str) -> dict[str, Any]:
        response = self.get(run_id)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    stops: list[Callable[[], None]] = []
    clients: list[httpx.Client] = []

    def start(fake: FakeN8n | None = None, **kw: Any) -> Served:
        fake = fake or FakeN8n(api_key=KEY, **kw)
        base_url, stop = serve_in_thread(fake)
        stops.append(stop)
        client = httpx.Client(base_url=base_url, timeout=5.0)
        clients.append(client)
        return Served(fake, base_url, client)

    try:
        yield start
    finally:
        for client in clients:
            client.close()
        for stop in stops:
            stop()


def manual() -> tuple[ManualClock, FakeN8n]:
    clock = ManualClock(T0)
    return clock, FakeN8n(api_key=KEY, clock=clock.now)


def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def parse(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --------------------------------------------------------------------------------------------
# Webhooks and callbacks


def test_webhook_answers_increasing_string_ids_and_success_calls_back(
    serve: Callable[..., Served], receiver: Receiver
) -> None:
    s = serve()
    workflow_id = s.fake.add_webhook("/webhook/fulfil", Script.succeed(0.3, result={"n": 7}))
    first = s.trigger("fulfil", "exec-1", receiver)
    second = s.trigger("fulfil", "exec-2", receiver)
    assert first.status_code == 200 and first.json() == {"executionId": "1"}
    assert second.json() == {"executionId": "2"}

    running_now = s.execution("1")
    assert running_now["id"] == "1"
    assert running_now["status"] == "running"
    assert running_now["finished"] is False
    assert running_now["mode"] == "webhook"
    assert running_now["stoppedAt"] is None and running_now["waitTill"] is None
    assert running_now["workflowId"] == workflow_id and len(workflow_id) == 16
    assert running_now["createdAt"] == running_now["startedAt"]
    assert running_now["createdAt"].endswith("Z")

    calls = receiver.wait(2)
    by_exec = {c.execution_id: c for c in calls}
    assert by_exec["exec-1"].kind == "complete"
    assert by_exec["exec-1"].authorization == "Bearer tok"
    assert by_exec["exec-1"].body == {"result": {"n": 7}}

    done = s.execution("1")
    assert done["status"] == "success" and done["finished"] is True
    stopped_at = parse(done["stoppedAt"])
    assert stopped_at >= parse(done["startedAt"]) + timedelta(seconds=0.29)

    truth = s.fake.truth("1")
    assert truth.execution_id == "exec-1" and truth.end == "success" and not truth.going
    assert truth.stopped_at is not None and truth.stopped_monotonic is not None
    assert truth.stopped_monotonic >= truth.started_monotonic + 0.29
    assert by_exec["exec-1"].at >= truth.stopped_at  # the callback comes after the stop
    assert truth.trigger_body["params"] == [1, "two"]
    attempts = s.fake.wait_for_callbacks(2)
    assert sorted((a.execution_id, a.status_code, a.attempt) for a in attempts) == [
        ("exec-1", 200, 1),
        ("exec-2", 200, 1),
    ]


def test_error_calls_the_fail_url(serve: Callable[..., Served], receiver: Receiver) -> None:
    s = serve()
    s.fake.add_webhook("fulfil", Script.fail(0.1, error={"message": "boom"}, transient=True))
    assert s.trigger("fulfil", "e", receiver).json() == {"executionId": "1"}
    (call,) = receiver.wait(1)
    assert call.kind == "fail"
    assert call.body == {"error": {"message": "boom"}, "transient": True}
    execution = s.execution("1")
    assert execution["status"] == "error" and execution["finished"] is False
    assert execution["stoppedAt"] is not None


def test_unknown_webhook_and_wrong_method_answer_like_n8n(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("fulfil")
    response = s.client.post("/webhook/nope", json={})
    assert response.status_code == 404
    assert response.json()["code"] == 404
    assert response.json()["message"] == 'The requested webhook "POST nope" is not registered.'
    assert "must be active" in response.json()["hint"]
    wrong = s.client.get("/webhook/fulfil")
    assert wrong.status_code == 404
    assert wrong.json()["message"] == (
        "This webhook is not registered for GET requests. Did you mean to make a POST request?"
    )
    test_url = s.client.post("/webhook-test/fulfil", json={"execution_id": "t"})
    assert test_url.json() == {"executionId": "1"}
    assert s.fake.truths()[0].execution_id == "t"


def test_default_response_carries_no_execution_id(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("fulfil", Script.succeed(respond="default"))
    response = s.trigger("fulfil", "e")
    assert response.json() == {"message": "Workflow was started"}
    assert [t.execution_id for t in s.fake.truths()] == ["e"]


def test_refused_trigger_creates_no_run(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("fulfil", Script(respond="refuse"))
    response = s.trigger("fulfil", "e")
    assert response.status_code == 403 and response.text == "Authorization data is wrong!"
    s.fake.queue_script(
        "fulfil",
        Script(respond="refuse", refuse_status=422, refuse_body={"message": "bad params"}),
    )
    response = s.trigger("fulfil", "e2")
    assert response.status_code == 422 and response.json() == {"message": "bad params"}
    assert s.fake.truths() == []


def test_trigger_times_out_after_the_run_started(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("slow", Script.forever(respond_delay=2.0))
    s.fake.add_webhook("never", Script.forever(respond="hang"))
    with pytest.raises(httpx.ReadTimeout):
        s.trigger("slow", "late", timeout=0.3)
    with pytest.raises(httpx.ReadTimeout):
        s.trigger("never", "lost", timeout=0.3)
    (late,) = s.fake.runs_for_execution("late")
    (lost,) = s.fake.runs_for_execution("lost")
    assert late.going and lost.going
    assert s.execution(late.run_id)["status"] == "running"
    # the hanging answer is released when the fake stops (checked by the fixture's stop)


def test_scripts_per_path_queue_and_execution_id(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("p", Script.succeed(5.0))
    s.fake.queue_script("p", Script.fail(5.0))
    s.fake.script_for_execution("chosen", Script.forever())
    s.trigger("p", "a")  # queued script
    s.trigger("p", "chosen")  # by execution id, queue untouched
    s.trigger("p", "b")  # default
    scripts = {t.execution_id: s.fake._runs[int(t.run_id)].script for t in s.fake.truths()}
    assert scripts["a"].outcome == "error"
    assert scripts["chosen"].outcome == "keep_running"
    assert scripts["b"].outcome == "success"


def test_queued_run_reads_new_then_running(serve: Callable[..., Served]) -> None:
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("p", Script(queued_for=1.0, steps=(Work(1.0),)))
    s.trigger("p", "e")
    first = s.execution("1")
    assert first["status"] == "new" and first["startedAt"] is None
    clock.advance(1.0)
    second = s.execution("1")
    assert second["status"] == "running"
    assert parse(second["startedAt"]) == T0 + timedelta(seconds=1)


# --------------------------------------------------------------------------------------------
# The executions API


def test_api_key_id_and_unknown_id(serve: Callable[..., Served]) -> None:
    s = serve()
    missing = s.client.get("/api/v1/executions/1")
    assert missing.status_code == 401
    assert missing.json() == {"message": "'X-N8N-API-KEY' header required"}
    wrong = s.client.get("/api/v1/executions/1", headers={"X-N8N-API-KEY": "nope"})
    assert wrong.status_code == 401 and wrong.json() == {"message": "unauthorized"}
    bad = s.get("abc")
    assert bad.status_code == 400
    assert bad.json() == {"message": "request/params/id must be number"}
    unknown = s.get("999")
    assert unknown.status_code == 404 and unknown.json() == {"message": "Not Found"}
    assert s.client.get("/api/v1/workflows", headers=H).status_code == 404


def test_wait_node_parks_with_stopped_at_then_resume_leaves_stale_stopped_at(
    serve: Callable[..., Served],
) -> None:
    clock, fake = manual()
    s = serve(fake)
    script = Script(
        steps=(Work(1.0), Wait(120.0, stale_stopped_for=3.0), Work(10.0)),
        outcome="success",
    )
    fake.add_webhook("p", script)
    s.trigger("p", "e")

    clock.advance(1.0)
    waiting = s.execution("1")
    parked_at = T0 + timedelta(seconds=1)
    assert waiting["status"] == "waiting" and waiting["finished"] is False
    assert parse(waiting["stoppedAt"]) == parked_at
    assert parse(waiting["waitTill"]) == parked_at + timedelta(seconds=120)
    assert fake.is_running_at("1", parked_at + timedelta(seconds=60))  # waiting is going

    clock.advance(120.0)
    resumed_at = parked_at + timedelta(seconds=120)
    just_resumed = s.execution("1")
    assert just_resumed["status"] == "running"
    assert parse(just_resumed["stoppedAt"]) == parked_at  # the OLD stoppedAt, still set
    assert parse(just_resumed["startedAt"]) == resumed_at  # overwritten at the resume
    assert parse(just_resumed["createdAt"]) == T0  # keeps the original start
    assert just_resumed["waitTill"] is None

    clock.advance(2.9)
    assert s.execution("1")["stoppedAt"] is not None
    clock.advance(0.2)
    settled = s.execution("1")
    assert settled["status"] == "running" and settled["stoppedAt"] is None

    clock.advance(10.0)
    done = s.execution("1")
    assert done["status"] == "success"
    assert parse(done["stoppedAt"]) == resumed_at + timedelta(seconds=10)
    events = [t.event for t in fake.truth("1").transitions]
    assert events == [
        "created",
        "started",
        "waiting",
        "resumed",
        "stale_cleared",
        "success",
        "callback_missing",
    ]


def test_short_wait_stays_running_like_n8n(serve: Callable[..., Served]) -> None:
    _clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("short", Script(steps=(Wait(30.0),), outcome="keep_running"))
    fake.add_webhook("long", Script(steps=(Wait(65.0),), outcome="keep_running"))
    s.trigger("short", "a")
    s.trigger("long", "b")
    short, long_ = s.execution("1"), s.execution("2")
    assert short["status"] == "running" and short["stoppedAt"] is None
    assert long_["status"] == "waiting" and long_["stoppedAt"] is not None


def test_webhook_wait_reads_year_3000_and_resumes_on_its_webhook(
    serve: Callable[..., Served], receiver: Receiver
) -> None:
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("p", Script(steps=(Wait(None, stale_stopped_for=0.0), Work(1.0))))
    s.trigger("p", "e", receiver)
    waiting = s.execution("1")
    assert waiting["status"] == "waiting"
    assert waiting["waitTill"] == "3000-01-01T00:00:00.000Z" == iso(WAIT_INDEFINITELY)
    assert waiting["stoppedAt"] == iso(T0)
    clock.advance(3600.0)
    assert s.execution("1")["status"] == "waiting"
    assert s.client.post("/webhook-waiting/1").status_code == 200
    assert s.execution("1")["status"] == "running"
    assert s.execution("1")["stoppedAt"] is None  # stale window of 0 s
    clock.advance(1.0)
    assert receiver.wait(1)[0].kind == "complete"
    again = s.client.post("/webhook-waiting/1")
    assert again.status_code == 409
    assert again.json()["message"] == 'The execution "1" has finished already.'
    assert s.client.post("/webhook-waiting/77").status_code == 404


def test_listing_omits_running_and_waiting_runs(serve: Callable[..., Served]) -> None:
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("ok", Script.succeed(1.0))
    fake.add_webhook("forever", Script.forever())
    fake.add_webhook("wait", Script(steps=(Wait(None),)))
    fake.add_webhook("bad", Script.fail(1.0))
    for path in ("ok", "forever", "wait", "bad", "ok"):
        s.trigger(path, path)
    clock.advance(1.0)
    listing = s.client.get("/api/v1/executions", headers=H).json()
    assert [e["id"] for e in listing["data"]] == ["5", "4", "1"]  # newest first
    assert listing["nextCursor"] is None
    assert {e["status"] for e in listing["data"]} == {"success", "error"}
    for status in ("running", "waiting"):
        filtered = s.client.get("/api/v1/executions", params={"status": status}, headers=H)
        assert filtered.json()["data"] == []
    # each id still answers on its own
    assert s.execution("2")["status"] == "running"
    assert s.execution("3")["status"] == "waiting"

    page = s.client.get("/api/v1/executions", params={"limit": 2}, headers=H).json()
    assert [e["id"] for e in page["data"]] == ["5", "4"]
    cursor = page["nextCursor"]
    assert json.loads(base64.b64decode(cursor))["lastId"] == "4"
    rest = s.client.get("/api/v1/executions", params={"cursor": cursor}, headers=H).json()
    assert [e["id"] for e in rest["data"]] == ["1"] and rest["nextCursor"] is None
    bad = s.client.get("/api/v1/executions", params={"status": "crashed"}, headers=H)
    assert bad.status_code == 400
    assert s.client.get("/api/v1/executions").status_code == 401


# --------------------------------------------------------------------------------------------
# Stopping


def login(s: Served, browser_id: str | None = "browser-1", password: str | None = None) -> str:
    headers = {"browser-id": browser_id} if browser_id else {}
    response = s.client.post(
        "/rest/login",
        json={"emailOrLdapLoginId": s.fake.email, "password": password or s.fake.password},
        headers=headers,
    )
    assert response.status_code == 200, response.text
    assert response.json()["data"]["email"] == s.fake.email
    token = response.cookies.get("n8n-auth")
    assert token
    s.client.cookies.clear()  # send the cookie explicitly below
    return token


def rest_stop(s: Served, run_id: str, token: str | None, browser_id: str | None) -> httpx.Response:
    headers: dict[str, str] = {}
    if token is not None:
        headers["cookie"] = f"n8n-auth={token}"
    if browser_id is not None:
        headers["browser-id"] = browser_id
    return s.client.post(f"/rest/executions/{run_id}/stop", headers=headers)


def test_v1_has_no_public_stop_and_stops_through_a_session(serve: Callable[..., Served]) -> None:
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("forever", Script.forever())
    fake.add_webhook("wait", Script(steps=(Wait(300.0),)))
    s.trigger("forever", "a")
    s.trigger("wait", "b")

    public = s.client.post("/api/v1/executions/1/stop", headers=H)
    assert public.status_code == 404 and public.json() == {"message": "not found"}

    wrong = s.client.post(
        "/rest/login", json={"emailOrLdapLoginId": fake.email, "password": "wrong"}
    )
    assert wrong.status_code == 401
    assert wrong.json()["message"] == "Wrong username or password. Do you have caps lock on?"

    token = login(s)
    assert rest_stop(s, "1", None, "browser-1").status_code == 401
    no_browser = rest_stop(s, "1", token, None)
    assert no_browser.status_code == 401
    assert no_browser.json() == {"status": "error", "message": "Unauthorized"}
    assert rest_stop(s, "1", token, "browser-2").status_code == 401
    assert rest_stop(s, "1", "forged", "browser-1").status_code == 401
    assert s.execution("1")["status"] == "running"

    clock.advance(5.0)
    stopped = rest_stop(s, "1", token, "browser-1")
    assert stopped.status_code == 200
    assert stopped.json()["data"]["status"] == "canceled"
    assert stopped.json()["data"]["finished"] is False
    execution = s.execution("1")
    assert execution["status"] == "canceled"
    assert parse(execution["stoppedAt"]) == T0 + timedelta(seconds=5)
    truth = fake.truth("1")
    assert truth.end == "canceled" and truth.stopped_at == T0 + timedelta(seconds=5)
    assert [r.outcome for r in truth.stop_requests] == ["stopped"]

    again = rest_stop(s, "1", token, "browser-1")
    assert again.status_code == 500
    assert again.json() == {
        "code": 0,
        "message": "Only running or waiting executions can be stopped and 1 is currently canceled",
    }
    unknown = rest_stop(s, "42", token, "browser-1")
    assert unknown.status_code == 500

    waiting = rest_stop(s, "2", token, "browser-1")
    assert waiting.status_code == 200
    after = s.execution("2")
    assert after["status"] == "canceled" and after["waitTill"] is None
    assert parse(after["stoppedAt"]) == T0 + timedelta(seconds=5)


def test_a_session_without_browser_id_is_not_bound(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("forever", Script.forever())
    s.trigger("forever", "a")
    token = login(s, browser_id=None)
    assert rest_stop(s, "1", token, None).status_code == 200


def test_v2_public_stop(serve: Callable[..., Served]) -> None:
    s = serve(version="2.0")
    s.fake.add_webhook("forever", Script.forever())
    s.trigger("forever", "a")
    assert s.client.post("/api/v1/executions/1/stop").status_code == 401
    assert s.client.post("/api/v1/executions/x/stop", headers=H).status_code == 400
    unknown = s.client.post("/api/v1/executions/9/stop", headers=H)
    assert unknown.status_code == 404 and unknown.json() == {"message": "Not Found"}
    ok = s.client.post("/api/v1/executions/1/stop", headers=H)
    assert ok.status_code == 200 and ok.json()["status"] == "canceled"
    assert s.execution("1")["status"] == "canceled"
    again = s.client.post("/api/v1/executions/1/stop", headers=H)
    assert again.status_code == 500
    assert again.json()["message"].startswith("Only running or waiting executions can be stopped")
    token = login(s)
    assert rest_stop(s, "1", token, "browser-1").status_code == 500  # internal stop too


def test_ignored_and_failed_stops(serve: Callable[..., Served]) -> None:
    s = serve(version="2.0")
    s.fake.add_webhook("stubborn", Script.forever(ignore_stops=1))
    s.fake.add_webhook("flaky", Script.forever(stop_failures=1))
    s.trigger("stubborn", "a")
    s.trigger("flaky", "b")

    ignored = s.client.post("/api/v1/executions/1/stop", headers=H)
    assert ignored.status_code == 200 and ignored.json()["status"] == "canceled"  # it claims
    assert s.execution("1")["status"] == "running"  # but the run goes on
    assert s.fake.truth("1").going
    assert s.client.post("/api/v1/executions/1/stop", headers=H).status_code == 200
    assert s.execution("1")["status"] == "canceled"
    assert [r.outcome for r in s.fake.truth("1").stop_requests] == ["ignored", "stopped"]

    failed = s.client.post("/api/v1/executions/2/stop", headers=H)
    assert failed.status_code == 500
    assert s.execution("2")["status"] == "running"
    assert s.client.post("/api/v1/executions/2/stop", headers=H).status_code == 200
    assert [r.outcome for r in s.fake.truth("2").stop_requests] == ["failed", "stopped"]


# --------------------------------------------------------------------------------------------
# Crashes, forgetting, misbehaving reads


def test_crash_and_forget(serve: Callable[..., Served], receiver: Receiver) -> None:
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("crash", Script(steps=(Work(1.0),), outcome="crash"))
    fake.add_webhook("forget", Script(steps=(Work(1.0),), outcome="forget"))
    s.trigger("crash", "a", receiver)
    s.trigger("forget", "b", receiver)
    assert s.execution("2")["status"] == "running"
    clock.advance(1.0)
    crashed = s.execution("1")
    assert crashed["status"] == "crashed" and crashed["stoppedAt"] == iso(clock.now())
    assert s.get("2").status_code == 404
    assert fake.truth("2").end == "forgotten" and fake.truth("2").forgotten
    fake.add_webhook("ok", Script.forever())
    s.trigger("ok", "c")
    fake.forget("3")
    assert s.get("3").status_code == 404
    assert fake.truth("3").stopped_at == clock.now()
    time.sleep(0.05)
    assert receiver.calls == [] and fake.callbacks() == []


def test_get_misbehaviours(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("p", Script.forever())
    for i in range(5):
        s.trigger("p", f"e{i}")
    s.fake.control("1", get_error=503)
    s.fake.control("2", get_delay=1.0)
    s.fake.control("3", get_hang=True)
    s.fake.control("4", get_raw_body="<html>Bad Gateway</html>")
    s.fake.control("5", report_status="unknown")

    assert s.get("1").status_code == 503
    with pytest.raises(httpx.ReadTimeout):
        s.get("2", timeout=0.2)
    started = time.monotonic()
    assert s.get("2", timeout=3.0).status_code == 200
    assert time.monotonic() - started >= 0.95
    with pytest.raises(httpx.ReadTimeout):
        s.get("3", timeout=0.2)
    raw = s.get("4")
    assert raw.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        raw.json()
    assert s.execution("5")["status"] == "unknown"
    s.fake.control("1", get_error=None)
    assert s.get("1").status_code == 200


def test_lost_and_duplicated_callbacks(serve: Callable[..., Served], receiver: Receiver) -> None:
    s = serve()
    s.fake.add_webhook("lost", Script.succeed(0.1, callback="lose"))
    s.fake.add_webhook("twice", Script.succeed(0.1, result=1, callback="duplicate"))
    receiver.statuses = [200, 409]
    s.trigger("lost", "l", receiver)
    s.trigger("twice", "d", receiver)
    calls = receiver.wait(2)
    time.sleep(0.2)
    assert [c.execution_id for c in receiver.calls] == ["d", "d"]
    assert calls[0].body == calls[1].body == {"result": 1}
    attempts = s.fake.callbacks()
    assert [(a.execution_id, a.attempt, a.status_code) for a in attempts] == [
        ("d", 1, 200),
        ("d", 2, 409),
    ]
    assert s.execution("1")["status"] == "success"
    assert "callback_lost" in [t.event for t in s.fake.truth("1").transitions]


def test_unreachable_callback_is_recorded(serve: Callable[..., Served]) -> None:
    s = serve()
    s.fake.add_webhook("p", Script.succeed(0.0))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    body = {
        "execution_id": "e",
        "callback": {
            "complete_url": f"http://127.0.0.1:{dead}/c",
            "fail_url": f"http://127.0.0.1:{dead}/f",
            "token": "t",
        },
    }
    s.client.post("/webhook/p", json=body)
    (attempt,) = s.fake.wait_for_callbacks(1)
    assert attempt.status_code is None and attempt.error and "ConnectError" in attempt.error


# --------------------------------------------------------------------------------------------
# Restarts


def test_restart_crashes_running_runs_and_keeps_waiting_ones(serve: Callable[..., Served]) -> None:
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("forever", Script.forever())
    fake.add_webhook("wait", Script(steps=(Wait(300.0), Work(60.0))))
    fake.add_webhook("crash", Script(steps=(), outcome="crash"))
    s.trigger("forever", "a")
    s.trigger("wait", "b")
    s.trigger("crash", "c")

    clock.advance(10.0)
    killed_at = clock.now()
    fake.kill()
    down = s.get("1")
    assert down.status_code == 503 and down.json()["code"] == 503
    assert s.trigger("forever", "x").status_code == 503
    assert s.client.get("/_fake/health").json()["down"] is True  # control stays up
    assert not fake.is_running_at("1", killed_at + timedelta(seconds=1))
    assert fake.truth("1").end == "killed"
    assert fake.truth("1").status == "running"  # the record still says running
    assert fake.is_running_at("2", killed_at + timedelta(seconds=1))
    with pytest.raises(RuntimeError):
        fake.resume("2")

    clock.advance(400.0)  # the wait's resume time passes while down
    started_at = clock.now()
    fake.start(starting_for=5.0)
    assert s.get("1").status_code == 404  # not mounted yet: see the start-up window's test
    resumed = fake.execution("2")  # what the API would say (it is not answering for now)
    assert resumed is not None
    assert resumed["status"] == "running"  # resumed at the start, its stoppedAt rewritten
    assert parse(resumed["startedAt"]) == started_at
    assert parse(resumed["stoppedAt"]) == started_at
    clock.advance(5.0)
    crashed = s.execution("1")
    assert crashed["status"] == "crashed" and parse(crashed["stoppedAt"]) == started_at
    assert s.execution("2")["stoppedAt"] is None
    assert parse(s.execution("3")["stoppedAt"]) == started_at  # crashed: rewritten
    assert fake.truth("2").going
    events = [t.event for t in fake.truth("1").transitions]
    assert events == ["created", "started", "killed", "crashed"]


def express_page(message: str) -> str:
    """Express's default 404 page (its final handler) for ``message``."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>Error</title>\n</head>\n<body>\n<pre>{message}</pre>\n</body>\n</html>\n"
    )


def test_after_a_restart_routes_answer_express_404_until_mounted(
    serve: Callable[..., Served],
) -> None:
    """Seen on a real n8n 1.123: for about 4 s after a crash or a clean restart, ``GET
    /api/v1/executions/{id}`` answers 404 text/html ``Cannot GET /api/v1/executions/{id}``
    (Express's default page: the public API is not mounted yet), for a known id as for any;
    afterwards the run reads as it is and a genuinely unknown id answers the API's JSON 404
    ``{"message": "Not Found"}``. n8n's source (``Start.run`` mounts every route in
    ``server.start()``; ``/healthz`` is registered before) gives the same answer for the other
    routes and ``{"status": "ok"}`` on ``/healthz`` throughout."""
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("wait", Script(steps=(Wait(None),)))
    s.trigger("wait", "b")

    fake.restart(starting_for=4.0)
    assert fake.phase() == "starting"
    known, unknown = s.get("1", params={"includeData": "true"}), s.get("999")
    for answer, path in ((known, "/api/v1/executions/1"), (unknown, "/api/v1/executions/999")):
        assert answer.status_code == 404
        assert answer.headers["content-type"] == "text/html; charset=utf-8"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["content-security-policy"] == "default-src 'none'"
        assert answer.text == express_page(f"Cannot GET {path}")  # no query string
    for method, path in (
        ("POST", "/api/v1/executions/1/stop"),
        ("POST", "/rest/login"),
        ("POST", "/rest/executions/1/stop"),
        ("POST", "/webhook/wait"),
        ("GET", "/api/v1/executions"),
    ):
        answer = s.client.request(method, path, headers=H, json={})
        assert (answer.status_code, answer.text) == (404, express_page(f"Cannot {method} {path}"))
    assert len(fake.truths()) == 1  # the webhook started nothing
    assert s.client.get("/healthz").json() == {"status": "ok"}
    assert s.client.get("/_fake/health").json()["phase"] == "starting"

    clock.advance(4.0)
    assert fake.phase() == "up"
    assert s.execution("1")["status"] == "waiting"
    after = s.get("999")
    assert after.status_code == 404 and after.json() == {"message": "Not Found"}
    assert after.headers["content-type"] == "application/json"


def test_while_migrating_every_route_but_healthz_says_starting_up(
    serve: Callable[..., Served],
) -> None:
    """n8n's source (``BaseCommand.init`` listens before ``migrate()``; the gate of
    ``AbstractServer.setupHealthCheck``): while its database migrations run, every route but
    ``/healthz`` answers 200 text/html ``n8n is starting up. Please wait``; then the routes
    are still unmounted (Express's 404) until ``server.start()``."""
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("p", Script.forever())
    fake.restart(migrating_for=2.0, starting_for=3.0)
    assert fake.phase() == "migrating"
    for method, path in (("GET", "/api/v1/executions/1"), ("POST", "/webhook/p")):
        answer = s.client.request(method, path, headers=H, json={})
        assert (answer.status_code, answer.text) == (200, "n8n is starting up. Please wait")
        assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert fake.truths() == []
    assert s.client.get("/healthz").json() == {"status": "ok"}
    clock.advance(2.0)
    assert fake.phase() == "starting"
    assert s.get("1").text == express_page("Cannot GET /api/v1/executions/1")
    clock.advance(3.0)
    assert fake.phase() == "up"
    assert s.get("1").json() == {"message": "Not Found"}


def test_start_up_windows_from_the_constructor_and_the_control_api(
    serve: Callable[..., Served],
) -> None:
    """The windows a fresh n8n shows (``FakeN8n(starting_for=)``: from when it is served) and
    after a restart through ``/_fake/restart``; bad windows are refused."""
    clock = ManualClock(T0)
    fake = FakeN8n(api_key=KEY, clock=clock.now, starting_for=2.0)
    assert fake.phase() == "up"  # not served yet
    s = serve(fake)
    assert fake.phase() == "starting"
    assert s.get("1").text == express_page("Cannot GET /api/v1/executions/1")
    clock.advance(2.0)
    assert s.get("1").json() == {"message": "Not Found"}

    c = s.client
    assert c.post("/_fake/restart", json={"migrating_for": 1, "starting_for": 3}).status_code == 200
    assert c.get("/_fake/health").json()["phase"] == "migrating"
    clock.advance(1.0)
    assert c.get("/_fake/health").json()["phase"] == "starting"
    clock.advance(3.0)
    assert c.get("/_fake/health").json()["phase"] == "up"
    assert c.post("/_fake/kill").json() == {"down": True}
    assert c.get("/_fake/health").json()["phase"] == "down"
    for bad in ({"starting_for": -1}, {"starting_for": "soon"}, {"migrating_for": float("inf")}):
        answer = c.post("/_fake/start", content=json.dumps(bad))
        assert answer.status_code == 400, bad
        assert fake.phase() == "down"  # a refused start changes nothing
    assert c.post("/_fake/start", json={"starting_for": 1.5}).json() == {"down": False}
    assert fake.phase() == "starting"
    with pytest.raises(ValueError):
        FakeN8n(starting_for=-1.0)


def test_restart_rewrites_stopped_at_of_a_waiting_run(serve: Callable[..., Served]) -> None:
    clock, fake = manual()
    s = serve(fake)
    fake.add_webhook("wait", Script(steps=(Wait(None),)))
    s.trigger("wait", "b")
    clock.advance(30.0)
    fake.restart()
    waiting = s.execution("1")
    assert waiting["status"] == "waiting"
    assert parse(waiting["stoppedAt"]) == T0 + timedelta(seconds=30)
    assert waiting["waitTill"] == iso(WAIT_INDEFINITELY)


# --------------------------------------------------------------------------------------------
# Ground truth


def test_truthful_violations() -> None:
    clock, fake = manual()
    fake.add_webhook("p", Script.succeed(10.0))
    run_id, _ = fake.trigger("p", {"execution_id": "e"})
    assert run_id == "1"
    fake.trigger("p", {"execution_id": "twice"})
    fake.trigger("p", {"execution_id": "twice"})
    clock.advance(5.0)
    early = {"e": clock.now()}
    assert fake.is_running_at("1", clock.now())
    assert fake.truthful_violations(early) == [
        "execution_id e: terminal in Veracity at 2030-01-01T12:00:05+00:00 but run 1 "
        "is still going (status running)"
    ]
    clock.advance(5.0)
    stopped = fake.truth("1").stopped_at
    assert stopped == T0 + timedelta(seconds=10)
    assert fake.truthful_violations(early)  # it was terminal too early
    assert fake.truthful_violations({"e": stopped}) == []
    assert fake.truthful_violations({"1": stopped}, key="run_id") == []
    assert not fake.is_running_at("1", stopped)
    assert fake.is_running_at("1", stopped - timedelta(microseconds=1))
    assert not fake.is_running_at("1", T0 - timedelta(seconds=1))
    assert len(fake.runs_for_execution("twice")) == 2
    with pytest.raises(ValueError):
        fake.is_running_at("1", datetime(2030, 1, 1))


# --------------------------------------------------------------------------------------------
# Control HTTP API, latency, scripts


def test_control_http_api(serve: Callable[..., Served], receiver: Receiver) -> None:
    s = serve()
    c = s.client
    registered = c.post(
        "/_fake/webhooks",
        json={"path": "/webhook/ctl", "script": {"steps": [{"work": None}], "outcome": "success"}},
    )
    assert registered.status_code == 200 and registered.json()["path"] == "ctl"
    assert (
        c.post(
            "/_fake/webhooks/next",
            json={"path": "ctl", "script": {"steps": [{"wait": None}]}},
        ).status_code
        == 200
    )
    by_exec = c.post(
        "/_fake/scripts/by-execution",
        json={"execution_id": "special", "script": {"steps": [], "outcome": "crash"}},
    )
    assert by_exec.status_code == 200
    s.trigger("ctl", "w", receiver)  # queued: waits for a webhook
    s.trigger("ctl", "special")  # crashes at once
    s.trigger("ctl", "plain", receiver)  # default: works forever
    assert s.execution("1")["status"] == "waiting"
    assert s.execution("2")["status"] == "crashed"

    patched = c.patch("/_fake/runs/3", json={"get_error": 502, "callback": "duplicate"})
    assert patched.status_code == 200 and patched.json()["run_id"] == "3"
    assert s.get("3").status_code == 502
    c.patch("/_fake/runs/3", json={"get_error": None})
    resumed = c.post("/_fake/runs/1/resume").json()  # nothing after its wait: it succeeds
    assert [t["event"] for t in resumed["transitions"]][-2:] == ["resumed", "success"]
    finished = c.post("/_fake/runs/3/finish", json={"outcome": "success", "result": {"k": 1}})
    assert finished.json()["status"] == "success" and finished.json()["going"] is False
    calls = receiver.wait(3)  # run 1 succeeded after its resume, run 3 twice
    assert sorted(call.execution_id for call in calls) == ["plain", "plain", "w"]
    assert {json.dumps(call.body) for call in calls if call.execution_id == "plain"} == {
        '{"result": {"k": 1}}'
    }
    until(lambda: len(c.get("/_fake/callbacks").json()["callbacks"]) == 3)

    runs = c.get("/_fake/runs").json()["runs"]
    assert [r["execution_id"] for r in runs] == ["w", "special", "plain"]
    truth = c.get("/_fake/runs/2").json()
    assert truth["end"] == "crashed" and truth["stopped_at"] is not None
    assert c.get("/_fake/runs/99").status_code == 404
    terminal_at = {"plain": "2000-01-01T00:00:00Z", "special": truth["stopped_at"]}
    violations = c.post("/_fake/violations", json={"terminal_at": terminal_at}).json()
    assert len(violations["violations"]) == 1 and "plain" in violations["violations"][0]

    s.trigger("ctl", "gone")
    assert c.post("/_fake/runs/4/forget").json()["forgotten"] is True
    assert s.get("4").status_code == 404

    assert c.post("/_fake/kill").json() == {"down": True}
    assert s.get("1").status_code == 503
    assert c.post("/_fake/start", json={}).json() == {"down": False}
    assert c.post("/_fake/restart").json() == {"down": False}
    settings = c.patch("/_fake/settings", json={"latency": 0.0, "version": "2.0"}).json()
    assert settings == {"latency": 0.0, "version": "2.0"}
    assert s.fake.has_public_stop

    assert c.post("/_fake/webhooks", json={"path": "x", "script": {"bogus": 1}}).status_code == 400
    assert c.post("/_fake/webhooks", json={}).status_code == 400
    assert c.post("/_fake/runs/1/finish", json={"outcome": "nope"}).status_code == 400
    assert c.get("/_fake/nothing").status_code == 404


def test_latency_applies_to_engine_requests_only(serve: Callable[..., Served]) -> None:
    s = serve(latency=0.3)
    started = time.monotonic()
    assert s.get("1").status_code == 404
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert s.client.get("/_fake/health").status_code == 200
    assert time.monotonic() - started < 0.3
    s.fake.latency = 0.0
    started = time.monotonic()
    assert s.get("1").status_code == 404
    assert time.monotonic() - started < 0.3


def test_script_json_round_trip_and_validation() -> None:
    script = Script(
        steps=(Work(0.1), Wait(70.0, park=False, stale_stopped_for=0.5), Wait(None), Work(None)),
        outcome="error",
        error={"m": 1},
        transient=False,
        callback="duplicate",
        ignore_stops=2,
        get_error=500,
    )
    assert Script.from_json(json.loads(json.dumps(script.to_json()))) == script
    for bad in (
        {"outcome": "maybe"},
        {"steps": [{"sleep": 1}]},
        {"steps": [{"work": -1}]},
        {"steps": [{"work": "1"}]},
        {"steps": {"work": 1}},
        {"respond": "later"},
        {"extra": True},
    ):
        with pytest.raises(ValueError):
            Script.from_json(bad)
    with pytest.raises(ValueError):
        FakeN8n(version="latest")


def test_serving_leaves_no_threads_behind() -> None:
    before = {t.ident for t in threading.enumerate()}
    fake = FakeN8n(api_key=KEY)
    fake.add_webhook("p", Script.forever(respond="hang"))
    with running(fake) as base_url, httpx.Client(base_url=base_url) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/webhook/p", json={}, timeout=0.2)
        assert client.get("/healthz").json() == {"status": "ok"}
    started = time.monotonic()
    until(lambda: {t.ident for t in threading.enumerate()} <= before)
    assert time.monotonic() - started < 2.0
    assert fake._runtime is None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_runs_alone_as_a_module() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "veracity.testing.fake_n8n",
            "--port",
            str(port),
            "--api-key",
            KEY,
            "--webhook",
            "/webhook/fulfil",
            "--starting-for",
            "2.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        base_url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base_url, timeout=2.0) as client:
            deadline = time.monotonic() + 15
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError("the fake did not start")
                time.sleep(0.05)
            # --starting-for: from launch, what a freshly started n8n 1.123 answers (Express's
            # 404 page until its routes are mounted; /healthz answers already)
            starting = client.get("/api/v1/executions/1", headers=H)
            assert starting.status_code == 404
            assert "<pre>Cannot GET /api/v1/executions/1</pre>" in starting.text
            until(lambda: client.get("/_fake/health").json()["phase"] == "up", timeout=10.0)
            unknown = client.get("/api/v1/executions/1", headers=H)
            assert unknown.status_code == 404 and unknown.json() == {"message": "Not Found"}
            answer = client.post("/webhook/fulfil", json={"execution_id": "e"})
            assert answer.json() == {"executionId": "1"}
            assert client.get("/api/v1/executions/1", headers=H).json()["status"] == "running"
    finally:
        process.terminate()
        out, err = process.communicate(timeout=10)
    assert f"listening on http://127.0.0.1:{port}" in out.decode()
    assert b"Warning" not in err, err.decode()
