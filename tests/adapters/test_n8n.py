"""The n8n adapter against the fake n8n served over loopback HTTP, and engine configuration.

Every engine call here crosses a real socket: the fake (``veracity.testing.fake_n8n``) runs
under uvicorn on a free loopback port, imitating n8n 1.x (no public stop) or 2.x.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from veracity._tls import ssl_context
from veracity.adapters import (
    CallbackInfo,
    Engine,
    EngineConfig,
    EngineErrorKind,
    N8nEngine,
    StartOutcome,
    StopMode,
    create_engine,
    parse_engine_config,
    parse_engines,
)
from veracity.adapters.n8n import webhook_url
from veracity.clock import ManualClock
from veracity.core.reconcile import EngineState
from veracity.errors import ConfigError
from veracity.testing.fake_n8n import (
    WAIT_INDEFINITELY,
    FakeN8n,
    Script,
    Wait,
    Work,
    iso,
    running,
    serve_asgi_in_thread,
)

API_KEY = "test-api-key"
EMAIL = "owner@example.com"
PASSWORD = "s3cret pass"
ENV = {"N8N_API_KEY": API_KEY, "N8N_EMAIL": EMAIL, "N8N_PASSWORD": PASSWORD}
V1, V2 = "1.123", "2.0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# Callbacks go to a closed loopback port: these tests are about the adapter, not /complete.
_CLOSED = f"http://127.0.0.1:{free_port()}"
CALLBACK = CallbackInfo(
    complete_url=f"{_CLOSED}/v1/executions/e1/complete",
    fail_url=f"{_CLOSED}/v1/executions/e1/fail",
    token="cb-token",
)


def config(
    base_url: str,
    *,
    login: bool = True,
    stop: str = "auto",
    timeout: float = 5.0,
    api_key: str = API_KEY,
    password: str = PASSWORD,
) -> EngineConfig:
    table: dict[str, Any] = {
        "base_url": base_url,
        "api_key_env": "N8N_API_KEY",
        "stop": stop,
        "timeout": timeout,
    }
    if login:
        table |= {"login_email_env": "N8N_EMAIL", "login_password_env": "N8N_PASSWORD"}
    return parse_engine_config(
        "n8n", table, ENV | {"N8N_API_KEY": api_key, "N8N_PASSWORD": password}
    )


class Recording(httpx.AsyncBaseTransport):
    """Real HTTP, with every request the adapter sends kept for the test to look at."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(verify=ssl_context())
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests]


@pytest.fixture
def wire() -> Recording:
    return Recording()


MakeEngine = Callable[..., N8nEngine]


@pytest.fixture
async def make_engine(base_url: str, wire: Recording) -> AsyncIterator[MakeEngine]:
    engines: list[N8nEngine] = []

    def make(**kwargs: Any) -> N8nEngine:
        engine = N8nEngine(config(base_url, **kwargs), transport=wire)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.aclose()


@pytest.fixture
async def engine(make_engine: MakeEngine) -> N8nEngine:
    return make_engine()


async def trigger(engine: N8nEngine, fake: FakeN8n, script: Script) -> str:
    """Start one run through the adapter, with ``script``; its n8n id."""
    fake.queue_script("fulfil", script)
    result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.STARTED, result
    assert result.external_id is not None
    return result.external_id


# ---------------------------------------------------------------------------
# start


async def test_start_posts_the_trigger_and_returns_the_execution_id(
    fake: FakeN8n, engine: N8nEngine, base_url: str, wire: Recording
) -> None:
    result = await engine.start("e1", [{"order": 7}, "x"], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.STARTED
    assert result.status_code == 200
    assert result.external_id is not None and result.external_id.isdigit()
    truth = fake.truth(result.external_id)
    assert truth.execution_id == "e1"
    assert truth.trigger_body == {
        "execution_id": "e1",
        "params": [{"order": 7}, "x"],
        "callback": {
            "complete_url": CALLBACK.complete_url,
            "fail_url": CALLBACK.fail_url,
            "token": "cb-token",
        },
    }
    sent = wire.requests[-1]
    assert sent.method == "POST"
    assert str(sent.url) == f"{base_url}/webhook/fulfil"
    # the webhook gets neither the API key nor a session cookie
    assert "x-n8n-api-key" not in sent.headers
    assert "cookie" not in sent.headers
    assert len(fake.runs_for_execution("e1")) == 1


async def test_start_to_a_path_without_a_slash_and_to_a_full_url(
    fake: FakeN8n, engine: N8nEngine, base_url: str
) -> None:
    first = await engine.start("e1", [], CALLBACK, target="webhook/fulfil")
    second = await engine.start("e2", [], CALLBACK, target=f"{base_url}/webhook/fulfil")
    assert first.outcome is second.outcome is StartOutcome.STARTED
    assert first.external_id != second.external_id


async def test_start_refused_by_an_unknown_webhook_carries_n8n_message(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    result = await engine.start("e1", [], CALLBACK, target="/webhook/nope")
    assert result.outcome is StartOutcome.REFUSED
    assert result.status_code == 404
    assert result.external_id is None
    assert 'The requested webhook "POST nope" is not registered.' in result.message
    assert "must be active" in result.message  # n8n's hint is kept
    assert fake.truths() == []


async def test_start_refused_by_webhook_auth(fake: FakeN8n, engine: N8nEngine) -> None:
    fake.queue_script("fulfil", Script(respond="refuse"))
    result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.REFUSED
    assert result.status_code == 403
    assert result.message == "Authorization data is wrong!"
    assert fake.truths() == []


@pytest.mark.parametrize(
    "script", [Script.forever(respond="hang"), Script.forever(respond_delay=5)]
)
async def test_start_timeout_is_ambiguous_and_the_run_exists(
    fake: FakeN8n, make_engine: MakeEngine, script: Script
) -> None:
    fake.queue_script("fulfil", script)
    engine = make_engine(timeout=0.3)
    result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.AMBIGUOUS
    assert result.external_id is None
    assert "may exist" in result.message
    # the run does exist in the engine: this is why an ambiguous start is never retried
    (truth,) = fake.runs_for_execution("e1")
    assert truth.going


async def test_start_without_a_respond_node_is_ambiguous_and_says_so(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    fake.queue_script("fulfil", Script.forever(respond="default"))
    result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.AMBIGUOUS
    assert "Respond to Webhook" in result.message
    assert "Workflow was started" in result.message
    assert len(fake.runs_for_execution("e1")) == 1


async def test_start_on_a_down_engine_answering_5xx_is_ambiguous(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    fake.kill()
    result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.AMBIGUOUS
    assert result.status_code == 503


async def test_start_answered_429_is_unavailable(fake: FakeN8n, engine: N8nEngine) -> None:
    fake.queue_script(
        "fulfil", Script(respond="refuse", refuse_status=429, refuse_body="Too Many Requests")
    )
    result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.UNAVAILABLE
    assert result.status_code == 429


async def test_start_to_a_closed_port_is_unavailable() -> None:
    async with N8nEngine(config(f"http://127.0.0.1:{free_port()}")) as engine:
        result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.UNAVAILABLE
    assert "no connection" in result.message


@pytest.mark.parametrize("target", ["", "   ", "ftp://host/x", "http://"])
async def test_start_to_a_bad_target_is_refused_without_a_request(
    engine: N8nEngine, wire: Recording, target: str
) -> None:
    result = await engine.start("e1", [], CALLBACK, target=target)
    assert result.outcome is StartOutcome.REFUSED
    assert wire.requests == []


def _respond_with(body: Any, status: int = 200) -> Starlette:
    async def webhook(request: Request) -> Response:
        if isinstance(body, str):
            return Response(body, status_code=status, media_type="text/html")
        return JSONResponse(body, status_code=status)

    return Starlette(routes=[Route("/webhook/{path:path}", webhook, methods=["POST"])])


@pytest.mark.parametrize(
    ("body", "outcome", "external_id"),
    [
        ({"executionId": "42"}, StartOutcome.STARTED, "42"),
        ({"executionId": 42}, StartOutcome.STARTED, "42"),  # a JSON number
        ({"executionId": " 42 "}, StartOutcome.STARTED, "42"),
        ([{"executionId": "42"}], StartOutcome.STARTED, "42"),  # "All Incoming Items"
        ({"executionId": "{{ $execution.id }}"}, StartOutcome.AMBIGUOUS, None),
        ({"executionId": ""}, StartOutcome.AMBIGUOUS, None),
        ({"executionId": True}, StartOutcome.AMBIGUOUS, None),
        ({"executionId": None}, StartOutcome.AMBIGUOUS, None),
        ({"id": "42"}, StartOutcome.AMBIGUOUS, None),
        ([{"executionId": "1"}, {"executionId": "2"}], StartOutcome.AMBIGUOUS, None),
        ("<html>ok</html>", StartOutcome.AMBIGUOUS, None),
    ],
)
async def test_start_reads_the_respond_node_answer(
    body: Any, outcome: StartOutcome, external_id: str | None
) -> None:
    url, stop = serve_asgi_in_thread(_respond_with(body))
    try:
        async with N8nEngine(config(url)) as engine:
            result = await engine.start("e1", [], CALLBACK, target="/webhook/x")
    finally:
        stop()
    assert result.outcome is outcome
    assert result.external_id == external_id


async def test_start_answered_by_a_redirect_is_ambiguous() -> None:
    url, stop = serve_asgi_in_thread(_respond_with({"location": "x"}, status=302))
    try:
        async with N8nEngine(config(url)) as engine:
            result = await engine.start("e1", [], CALLBACK, target="/webhook/x")
    finally:
        stop()
    assert result.outcome is StartOutcome.AMBIGUOUS


def test_webhook_url() -> None:
    base = "http://n8n.test:5678/n8n"
    assert webhook_url(base, "/webhook/a") == "http://n8n.test:5678/n8n/webhook/a"
    assert webhook_url(base + "/", "webhook/a") == "http://n8n.test:5678/n8n/webhook/a"
    assert webhook_url(base, "https://x.test/webhook/a") == "https://x.test/webhook/a"
    for bad in ("", "mailto://x", "http://"):
        with pytest.raises(ValueError):
            webhook_url(base, bad)


# ---------------------------------------------------------------------------
# inspect


async def test_inspect_a_running_run(fake: FakeN8n, engine: N8nEngine, wire: Recording) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    inspection = await engine.inspect(run_id)
    assert inspection.state is EngineState.RUNNING
    assert (inspection.status, inspection.stopped_at, inspection.wait_till) == (
        "running",
        None,
        None,
    )
    assert inspection.error is None and not inspection.not_found
    sent = wire.requests[-1]
    assert (sent.method, sent.url.path) == ("GET", f"/api/v1/executions/{run_id}")
    assert sent.headers["X-N8N-API-KEY"] == API_KEY
    assert "cookie" not in sent.headers


async def test_inspect_a_queued_run(fake: FakeN8n, engine: N8nEngine) -> None:
    run_id = await trigger(engine, fake, Script.forever(queued_for=3600))
    inspection = await engine.inspect(run_id)
    assert (inspection.state, inspection.status) == (EngineState.RUNNING, "new")


@pytest.mark.parametrize(
    ("outcome", "status"),
    [("success", "success"), ("error", "error"), ("crash", "crashed")],
)
async def test_inspect_finished_runs(
    fake: FakeN8n, engine: N8nEngine, outcome: Any, status: str
) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    fake.finish(run_id, outcome)
    inspection = await engine.inspect(run_id)
    assert inspection.state is EngineState.FINISHED
    assert inspection.status == status
    assert inspection.stopped_at is not None


async def test_inspect_a_run_parked_in_a_wait_node_is_running_though_stopped_at_is_set(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    run_id = await trigger(engine, fake, Script(steps=(Wait(None),), outcome="keep_running"))
    inspection = await engine.inspect(run_id)
    assert inspection.status == "waiting"
    assert inspection.stopped_at is not None
    assert inspection.wait_till == iso(WAIT_INDEFINITELY)
    assert inspection.state is EngineState.RUNNING


async def test_inspect_a_short_wait_stays_running(fake: FakeN8n, engine: N8nEngine) -> None:
    run_id = await trigger(engine, fake, Script(steps=(Wait(30),), outcome="keep_running"))
    inspection = await engine.inspect(run_id)
    assert (inspection.status, inspection.stopped_at) == ("running", None)
    assert inspection.state is EngineState.RUNNING


async def test_inspect_just_after_a_resume_reads_running_with_a_stale_stopped_at(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    script = Script(steps=(Wait(None, stale_stopped_for=60), Work(None)), outcome="keep_running")
    run_id = await trigger(engine, fake, script)
    parked = await engine.inspect(run_id)
    fake.resume(run_id)
    resumed = await engine.inspect(run_id)
    assert resumed.status == "running"
    assert resumed.stopped_at == parked.stopped_at is not None
    assert resumed.state is EngineState.RUNNING


async def test_inspect_a_stopped_run(fake: FakeN8n, engine: N8nEngine) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    assert (await engine.stop(run_id)).ok
    inspection = await engine.inspect(run_id)
    assert (inspection.state, inspection.status) == (EngineState.FINISHED, "canceled")


@pytest.mark.parametrize(
    ("reported", "kind"),
    [
        ("unknown", EngineErrorKind.UNKNOWN_STATUS),
        ("paused", EngineErrorKind.UNKNOWN_STATUS),
        ("failed", EngineErrorKind.UNKNOWN_STATUS),
        ("", EngineErrorKind.UNKNOWN_STATUS),
        # success while stoppedAt is still null contradicts itself
        ("success", EngineErrorKind.INCONSISTENT),
        ("crashed", EngineErrorKind.INCONSISTENT),
    ],
)
async def test_inspect_odd_statuses_are_unknown(
    fake: FakeN8n, engine: N8nEngine, reported: str, kind: EngineErrorKind
) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    fake.control(run_id, report_status=reported)
    inspection = await engine.inspect(run_id)
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.error is kind
    assert inspection.status == reported


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("<html>n8n</html>", EngineErrorKind.BAD_JSON),
        ("", EngineErrorKind.BAD_JSON),
        ("[1, 2]", EngineErrorKind.BAD_JSON),
        ('"running"', EngineErrorKind.BAD_JSON),
        ('{"stoppedAt": null}', EngineErrorKind.MISSING_FIELDS),
        ('{"status": 3}', EngineErrorKind.MISSING_FIELDS),
        ('{"status": null}', EngineErrorKind.MISSING_FIELDS),
        ('{"status": "success", "stoppedAt": 1234}', EngineErrorKind.MISSING_FIELDS),
        ('{"status": "waiting", "waitTill": false}', EngineErrorKind.MISSING_FIELDS),
        ('{"id": "999999", "status": "success", "stoppedAt": "x"}', EngineErrorKind.INCONSISTENT),
        ('{"id": true, "status": "running"}', EngineErrorKind.INCONSISTENT),
    ],
)
async def test_inspect_bad_answers_are_unknown(
    fake: FakeN8n, engine: N8nEngine, raw: str, kind: EngineErrorKind
) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    fake.control(run_id, get_raw_body=raw)
    inspection = await engine.inspect(run_id)
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.error is kind
    assert inspection.detail


async def test_inspect_accepts_the_id_as_a_json_number(fake: FakeN8n, engine: N8nEngine) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    fake.control(run_id, get_raw_body=f'{{"id": {run_id}, "status": "running"}}')
    assert (await engine.inspect(run_id)).state is EngineState.RUNNING


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_inspect_5xx_is_unknown(fake: FakeN8n, engine: N8nEngine, status: int) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    fake.control(run_id, get_error=status)
    inspection = await engine.inspect(run_id)
    assert inspection.error is EngineErrorKind.SERVER_ERROR
    assert inspection.detail.startswith(str(status))
    assert not inspection.needs_operator


async def test_inspect_while_n8n_is_down_or_starting(fake: FakeN8n, engine: N8nEngine) -> None:
    """n8n's source (``BaseCommand.init``, ``AbstractServer.setupHealthCheck``): while its
    migrations run n8n answers 200 ``n8n is starting up. Please wait``; seen on a real n8n
    1.123: then, until its API is mounted, 404 ``Cannot GET /api/v1/executions/{id}``
    (HTML). Neither is about the run: unknown, ``not_ready``, nobody flagged."""
    run_id = await trigger(engine, fake, Script.forever())
    fake.kill()
    down = await engine.inspect(run_id)
    assert down.error is EngineErrorKind.SERVER_ERROR
    fake.start(migrating_for=60)
    migrating = await engine.inspect(run_id)
    assert migrating.error is EngineErrorKind.NOT_READY and not migrating.needs_operator
    assert migrating.detail == (
        "200: n8n is starting up (migrating its database): n8n is starting up. Please wait"
    )
    fake.restart(starting_for=60)
    starting = await engine.inspect(run_id)
    assert starting.state is EngineState.UNKNOWN
    assert starting.error is EngineErrorKind.NOT_READY
    assert not starting.needs_operator and not starting.not_found
    assert starting.detail == (
        "404: n8n's API is not answering yet (starting up?): "
        f"Cannot GET /api/v1/executions/{run_id}"
    )


async def test_inspect_an_unknown_or_forgotten_id_is_not_found(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    """Seen on a real n8n 1.123: a genuinely unknown id answers 404 JSON ``{"message": "Not
    Found"}`` (the API's own answer): the engine does not know the id; flag it."""
    unknown = await engine.inspect("424242")
    assert unknown.state is EngineState.UNKNOWN
    assert unknown.error is EngineErrorKind.NOT_FOUND and unknown.not_found
    assert unknown.needs_operator
    assert "Not Found" in unknown.detail
    run_id = await trigger(engine, fake, Script.forever())
    fake.forget(run_id)
    assert (await engine.inspect(run_id)).not_found


@pytest.mark.parametrize("bad_id", ["abc", "12a", "-1", "1.5"])
async def test_inspect_a_non_numeric_id_is_a_bad_request(engine: N8nEngine, bad_id: str) -> None:
    inspection = await engine.inspect(bad_id)
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.error is EngineErrorKind.BAD_REQUEST
    assert not inspection.not_found
    assert inspection.needs_operator
    assert "must be number" in inspection.detail


async def test_inspect_an_id_with_a_slash_stays_one_path_segment(
    engine: N8nEngine, wire: Recording
) -> None:
    inspection = await engine.inspect("1/../../workflows")
    assert wire.requests[-1].url.raw_path == b"/api/v1/executions/1%2F..%2F..%2Fworkflows"
    # whatever the server makes of it, it is no run of this id: unknown, for an operator
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.needs_operator


async def test_inspect_an_empty_id_asks_nothing(engine: N8nEngine, wire: Recording) -> None:
    inspection = await engine.inspect("")
    assert inspection.error is EngineErrorKind.BAD_REQUEST
    assert wire.requests == []


async def test_inspect_with_a_wrong_key_is_unauthorized(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine
) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    inspection = await make_engine(api_key="wrong").inspect(run_id)
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.error is EngineErrorKind.UNAUTHORIZED
    assert "unauthorized" in inspection.detail


@pytest.mark.parametrize("hang", [True, False])
async def test_inspect_timeout(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine, hang: bool
) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    if hang:
        fake.control(run_id, get_hang=True)
    else:
        fake.control(run_id, get_delay=5)
    inspection = await make_engine(timeout=0.3).inspect(run_id)
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.error is EngineErrorKind.TIMEOUT
    assert not inspection.needs_operator


async def test_inspect_an_unreachable_port() -> None:
    async with N8nEngine(config(f"http://127.0.0.1:{free_port()}")) as engine:
        inspection = await engine.inspect("1")
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.error is EngineErrorKind.UNREACHABLE


async def test_inspections_run_concurrently_on_one_client(fake: FakeN8n, engine: N8nEngine) -> None:
    fake.latency = 0.05
    ids = fake.start_runs("fulfil", [{"execution_id": f"e{i}"} for i in range(40)])
    loop = asyncio.get_running_loop()
    began = loop.time()
    results = await asyncio.gather(*(engine.inspect(i) for i in ids))
    assert all(r.state is EngineState.RUNNING for r in results)
    assert loop.time() - began < 40 * 0.05 / 2  # not one after the other


# ---------------------------------------------------------------------------
# n8n's start-up window (a fake on a manual clock, so the window ends exactly)


@pytest.fixture
def restarting() -> Iterator[tuple[ManualClock, FakeN8n, str]]:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    n8n = FakeN8n(version=V1, api_key=API_KEY, email=EMAIL, password=PASSWORD, clock=clock.now)
    n8n.add_webhook("fulfil", Script(steps=(Wait(None),)))  # a waiting run survives restarts
    with running(n8n) as url:
        yield clock, n8n, url


async def test_inspect_in_the_start_up_window_is_not_ready_on_both_paths(
    restarting: tuple[ManualClock, FakeN8n, str],
) -> None:
    """Seen on a real n8n 1.123: for about 4 s after a crash or a clean restart, ``GET
    /api/v1/executions/{id}`` answers 404 text/html ``Cannot GET /api/v1/executions/{id}``,
    for a known id as for an unknown one; a genuinely unknown id answers 404 JSON
    ``{"message": "Not Found"}``. In the window: unknown, ``not_ready``, not flagged, on the
    httpx and the aiohttp paths alike; after it, the run as it is, and ``not_found``."""
    clock, fake, url = restarting
    async with (
        N8nEngine(config(url), transport=httpx.AsyncHTTPTransport(verify=ssl_context())) as slow,
        N8nEngine(config(url)) as fast,
    ):
        run_id = await trigger(slow, fake, Script(steps=(Wait(None),)))
        fake.restart(starting_for=4.0)
        for engine in (slow, fast):
            for external_id in (run_id, "424242"):
                inspection = await engine.inspect(external_id)
                assert inspection.state is EngineState.UNKNOWN
                assert inspection.error is EngineErrorKind.NOT_READY
                assert not inspection.needs_operator and not inspection.not_found
                assert f"Cannot GET /api/v1/executions/{external_id}" in inspection.detail
        clock.advance(4.0)
        for engine in (slow, fast):
            after = await engine.inspect(run_id)
            assert (after.state, after.status) == (EngineState.RUNNING, "waiting")
            unknown = await engine.inspect("424242")
            assert unknown.error is EngineErrorKind.NOT_FOUND and unknown.needs_operator


async def test_start_in_the_start_up_window_is_unavailable_and_starts_nothing(
    restarting: tuple[ManualClock, FakeN8n, str],
) -> None:
    """Seen on a real n8n 1.123 (the API's routes) and n8n's source (``server.start()`` mounts
    the webhooks with them): until then ``POST /webhook/...`` answers Express's 404 page, and
    while it migrates 200 ``n8n is starting up. Please wait``: nothing was started."""
    clock, fake, url = restarting
    async with N8nEngine(config(url)) as engine:
        fake.restart(migrating_for=1.0, starting_for=4.0)
        migrating = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
        assert migrating.outcome is StartOutcome.UNAVAILABLE and migrating.status_code == 200
        assert "n8n is starting up" in migrating.message
        clock.advance(1.0)
        starting = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
        assert starting.outcome is StartOutcome.UNAVAILABLE and starting.status_code == 404
        assert "Cannot POST /webhook/fulfil" in starting.message
        assert fake.truths() == []
        clock.advance(4.0)
        started = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
        assert started.outcome is StartOutcome.STARTED


async def test_stop_in_the_start_up_window_fails_and_does_not_fall_back(
    restarting: tuple[ManualClock, FakeN8n, str], wire: Recording
) -> None:
    """Seen on a real n8n 1.123: until its API is mounted n8n answers Express's HTML 404
    (``Cannot POST /api/v1/executions/{id}/stop``), not its API's JSON 404 of an unknown
    route: the public stop's existence is unknown and ``/rest/`` is not mounted either, so
    ``auto`` does not try the session stop. The stop fails; nothing is stopped; once n8n is up
    the API's JSON 404 (1.x: no public stop) sends it to the session stop as before."""
    clock, fake, url = restarting
    async with N8nEngine(config(url), transport=wire) as engine:
        run_id = await trigger(engine, fake, Script(steps=(Wait(None),)))
        fake.restart(migrating_for=1.0, starting_for=4.0)
        migrating = await engine.stop(run_id)  # 200 "starting up" is no accepted stop
        assert not migrating.ok and migrating.status_code == 200
        assert "n8n is starting up" in migrating.reason
        clock.advance(1.0)
        result = await engine.stop(run_id)
        assert not result.ok and (result.method, result.status_code) == ("public", 404)
        assert "not answering yet" in result.reason
        assert f"Cannot POST /api/v1/executions/{run_id}/stop" in result.reason
        assert "/rest/login" not in wire.paths()
        assert fake.truth(run_id).stop_requests == () and fake.truth(run_id).going
        clock.advance(4.0)
        after = await engine.stop(run_id)
        assert after.ok and after.method == "session"
        assert [r.via for r in fake.truth(run_id).stop_requests] == ["rest"]


async def test_session_stop_in_the_start_up_window_fails_at_login(
    restarting: tuple[ManualClock, FakeN8n, str],
) -> None:
    """Seen on a real n8n 1.123 (the routes are not mounted for about 4 s after a restart):
    ``POST /rest/login`` answers Express's HTML 404; the session stop says n8n is starting."""
    _, fake, url = restarting
    async with N8nEngine(config(url, stop="session")) as engine:
        run_id = await trigger(engine, fake, Script(steps=(Wait(None),)))
        fake.restart(starting_for=4.0)
        result = await engine.stop(run_id)
    assert not result.ok and (result.method, result.status_code) == ("session", 404)
    assert result.reason.startswith("login: n8n's API is not answering yet (starting up?)")
    assert "Cannot POST /rest/login" in result.reason
    assert fake.truth(run_id).going


# ---------------------------------------------------------------------------
# stop


async def test_public_stop_on_n8n_2(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine, wire: Recording
) -> None:
    run_id = await trigger(engine, fake, Script(steps=(Wait(None),), outcome="keep_running"))
    result = await make_engine(login=False).stop(run_id)
    assert result.ok and result.method == "public" and result.status_code == 200
    sent = wire.requests[-1]
    assert (sent.method, sent.url.path) == ("POST", f"/api/v1/executions/{run_id}/stop")
    assert sent.headers["X-N8N-API-KEY"] == API_KEY
    assert [s.via for s in fake.truth(run_id).stop_requests] == ["public"]
    assert not fake.truth(run_id).going
    # the caller inspects again and decides from that
    inspection = await engine.inspect(run_id)
    assert (inspection.state, inspection.status) == (EngineState.FINISHED, "canceled")


async def test_public_stop_of_a_finished_run_fails_without_raising(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    fake.finish(run_id, "success")
    result = await engine.stop(run_id)
    assert not result.ok
    assert result.status_code == 500
    assert "Only running or waiting executions can be stopped" in result.reason


async def test_a_stop_that_fails_then_succeeds(fake: FakeN8n, engine: N8nEngine) -> None:
    run_id = await trigger(engine, fake, Script.forever(stop_failures=1))
    first = await engine.stop(run_id)
    assert not first.ok and first.status_code == 500
    assert (await engine.inspect(run_id)).state is EngineState.RUNNING
    assert (await engine.stop(run_id)).ok
    assert (await engine.inspect(run_id)).state is EngineState.FINISHED


async def test_an_accepted_stop_proves_nothing_inspect_again(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    run_id = await trigger(engine, fake, Script.forever(ignore_stops=1))
    assert (await engine.stop(run_id)).ok
    assert (await engine.inspect(run_id)).state is EngineState.RUNNING
    assert fake.truth(run_id).going


async def test_stop_mode_public_does_not_fall_back_on_n8n_1(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine, wire: Recording
) -> None:
    fake.version = V1
    run_id = await trigger(engine, fake, Script.forever())
    result = await make_engine(stop="public").stop(run_id)
    assert not result.ok and result.status_code == 404
    assert "/rest/login" not in wire.paths()
    assert fake.truth(run_id).going


async def test_auto_stop_falls_back_to_the_session_on_n8n_1(
    fake: FakeN8n, engine: N8nEngine, wire: Recording
) -> None:
    fake.version = V1
    run_id = await trigger(engine, fake, Script.forever())
    result = await engine.stop(run_id)
    assert result.ok and result.method == "session"
    public, login, stop = wire.requests[-3:]
    assert public.url.path == f"/api/v1/executions/{run_id}/stop"
    assert login.url.path == "/rest/login"
    assert stop.url.path == f"/rest/executions/{run_id}/stop"
    assert login.headers["browser-id"] == stop.headers["browser-id"]
    assert "n8n-auth=" in stop.headers["cookie"]
    assert "x-n8n-api-key" not in stop.headers and "x-n8n-api-key" not in login.headers
    assert [s.via for s in fake.truth(run_id).stop_requests] == ["rest"]
    assert (await engine.inspect(run_id)).state is EngineState.FINISHED

    # the session is reused
    second = await trigger(engine, fake, Script.forever())
    assert (await engine.stop(second)).ok
    assert wire.paths().count("/rest/login") == 1


async def test_session_stop_of_a_stopped_or_unknown_run_is_a_failed_stop(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine
) -> None:
    fake.version = V1
    session = make_engine(stop="session")
    run_id = await trigger(engine, fake, Script.forever())
    assert (await session.stop(run_id)).ok
    again = await session.stop(run_id)
    assert not again.ok and again.status_code == 500
    assert "Only running or waiting executions can be stopped" in again.reason
    assert f"{run_id} is currently canceled" in again.reason
    unknown = await session.stop("424242")
    assert not unknown.ok and unknown.status_code == 500


async def test_session_stop_logs_in_again_once_after_401(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine, wire: Recording
) -> None:
    fake.version = V1
    session = make_engine(stop="session")
    assert (await session.stop(await trigger(engine, fake, Script.forever()))).ok
    with fake._lock:  # n8n restarted with a new secret, or the session was revoked
        fake._sessions.clear()
    run_id = await trigger(engine, fake, Script.forever())
    result = await session.stop(run_id)
    assert result.ok
    assert wire.paths().count("/rest/login") == 2
    assert not fake.truth(run_id).going


async def test_session_stop_gives_up_after_a_second_401(
    fake: FakeN8n,
    engine: N8nEngine,
    make_engine: MakeEngine,
    wire: Recording,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake.version = V1
    run_id = await trigger(engine, fake, Script.forever())
    monkeypatch.setattr(fake, "session_ok", lambda token, browser_id: False)
    result = await make_engine(stop="session").stop(run_id)
    assert not result.ok and result.status_code == 401
    assert wire.paths().count("/rest/login") == 2
    assert fake.truth(run_id).going


async def test_session_stop_needs_the_same_browser_id(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine, wire: Recording
) -> None:
    # another adapter's session (another browser-id) is refused by n8n: each adapter keeps
    # its own cookie and browser-id, so both work side by side
    fake.version = V1
    a, b = make_engine(stop="session"), make_engine(stop="session")
    assert (await a.stop(await trigger(engine, fake, Script.forever()))).ok
    assert (await b.stop(await trigger(engine, fake, Script.forever()))).ok
    logins = [r for r in wire.requests if r.url.path == "/rest/login"]
    assert len(logins) == 2
    assert logins[0].headers["browser-id"] != logins[1].headers["browser-id"]


async def test_concurrent_session_stops_log_in_once(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine, wire: Recording
) -> None:
    fake.version = V1
    ids = [await trigger(engine, fake, Script.forever()) for _ in range(10)]
    session = make_engine(stop="session")
    results = await asyncio.gather(*(session.stop(i) for i in ids))
    assert all(r.ok for r in results)
    assert wire.paths().count("/rest/login") == 1


async def test_wrong_password_is_a_failed_stop(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine
) -> None:
    fake.version = V1
    run_id = await trigger(engine, fake, Script.forever())
    result = await make_engine(password="nope").stop(run_id)
    assert not result.ok and result.status_code == 401
    assert "login answered 401" in result.reason
    assert "caps lock" in result.reason
    assert fake.truth(run_id).going


async def test_auto_stop_on_n8n_1_without_a_login_says_what_to_configure(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine
) -> None:
    fake.version = V1
    run_id = await trigger(engine, fake, Script.forever())
    result = await make_engine(login=False).stop(run_id)
    assert not result.ok
    assert "login_email_env" in result.reason and "engines.n8n" in result.reason


async def test_the_session_cookie_never_reaches_a_webhook(
    fake: FakeN8n, engine: N8nEngine, wire: Recording
) -> None:
    fake.version = V1
    assert (await engine.stop(await trigger(engine, fake, Script.forever()))).ok
    await engine.start("e9", [], CALLBACK, target="/webhook/fulfil")
    assert wire.requests[-1].url.path == "/webhook/fulfil"
    assert "cookie" not in wire.requests[-1].headers


async def test_stop_while_n8n_is_down_fails_without_raising(
    fake: FakeN8n, engine: N8nEngine
) -> None:
    run_id = await trigger(engine, fake, Script.forever())
    fake.kill()
    result = await engine.stop(run_id)
    assert not result.ok and result.status_code == 503


async def test_stop_unreachable_or_slow_fails_without_raising(
    fake: FakeN8n, engine: N8nEngine, make_engine: MakeEngine
) -> None:
    async with N8nEngine(config(f"http://127.0.0.1:{free_port()}")) as closed:
        result = await closed.stop("1")
    assert not result.ok and "unreachable" in result.reason

    run_id = await trigger(engine, fake, Script.forever())
    fake.latency = 1.0
    slow = await make_engine(timeout=0.3).stop(run_id)
    assert not slow.ok and "no answer within 0.3s" in slow.reason


async def test_stop_empty_id(engine: N8nEngine, wire: Recording) -> None:
    assert not (await engine.stop("")).ok
    assert wire.requests == []


# ---------------------------------------------------------------------------
# the protocol


async def test_n8n_engine_is_an_engine() -> None:
    engine = create_engine(config("http://127.0.0.1:5678"))
    try:
        assert isinstance(engine, Engine)
        assert isinstance(engine, N8nEngine)
        assert engine.name == "n8n"
    finally:
        await engine.aclose()


# ---------------------------------------------------------------------------
# configuration

BASE = {"base_url": "http://127.0.0.1:5678", "api_key_env": "N8N_API_KEY"}


def test_config_defaults() -> None:
    cfg = parse_engine_config("n8n", BASE, ENV)
    assert cfg.base_url == "http://127.0.0.1:5678"
    assert cfg.api_key == API_KEY
    assert cfg.stop is StopMode.AUTO
    assert cfg.timeout == 10.0
    assert not cfg.has_login
    assert cfg.entry == "engines.n8n"
    assert API_KEY not in repr(cfg)


def test_config_full() -> None:
    cfg = parse_engine_config(
        "prod-n8n",
        BASE
        | {
            "base_url": "https://n8n.example.com/base/",
            "login_email_env": "N8N_EMAIL",
            "login_password_env": "N8N_PASSWORD",
            "stop": "session",
            "timeout": "1m30s",
            "type": "n8n",
        },
        ENV,
    )
    assert cfg.base_url == "https://n8n.example.com/base"
    assert cfg.login_email == EMAIL and cfg.login_password == PASSWORD
    assert cfg.has_login
    assert cfg.stop is StopMode.SESSION
    assert cfg.timeout == 90.0
    assert PASSWORD not in repr(cfg)


@pytest.mark.parametrize(
    ("table", "env", "message"),
    [
        ({"api_key_env": "N8N_API_KEY"}, ENV, "engines.n8n: base_url: required"),
        (BASE | {"base_url": "127.0.0.1:5678"}, ENV, "engines.n8n: base_url: expected an http"),
        (BASE | {"base_url": "ftp://h"}, ENV, "engines.n8n: base_url: expected an http"),
        (BASE | {"base_url": "http://"}, ENV, "engines.n8n: base_url: expected an http"),
        (BASE | {"base_url": "http://h:99999"}, ENV, "engines.n8n: base_url: invalid URL"),
        (BASE | {"base_url": 5678}, ENV, "engines.n8n: base_url: expected an http"),
        (
            {"base_url": "http://h"},
            ENV,
            "engines.n8n: api_key_env: required",
        ),
        (
            BASE,
            {},
            "engines.n8n: api_key_env N8N_API_KEY is not set in the environment",
        ),
        (
            BASE,
            {"N8N_API_KEY": "  "},
            "engines.n8n: api_key_env N8N_API_KEY is not set in the environment",
        ),
        (
            BASE | {"api_key_env": "n8n_api_1234567890.abc"},
            ENV,
            "engines.n8n: api_key_env: expected the name of an environment variable",
        ),
        (
            BASE | {"api_key": "secret"},
            ENV,
            "engines.n8n: api_key: the key itself never sits in the file",
        ),
        (BASE | {"base_ulr": "x"}, ENV, "engines.n8n: base_ulr: unknown key"),
        (
            BASE | {"login_email_env": "N8N_EMAIL"},
            ENV,
            "engines.n8n: login_email_env and login_password_env go together",
        ),
        (
            BASE | {"login_email_env": "N8N_EMAIL", "login_password_env": "N8N_PASSWORD"},
            {"N8N_API_KEY": "k", "N8N_EMAIL": "a@b.c"},
            "engines.n8n: login_password_env N8N_PASSWORD is not set in the environment",
        ),
        (BASE | {"stop": "kill"}, ENV, "engines.n8n: stop: expected 'public', 'session'"),
        (BASE | {"stop": ["public"]}, ENV, "engines.n8n: stop: expected"),
        (BASE | {"stop": "session"}, ENV, "engines.n8n: stop = 'session' needs login"),
        (BASE | {"timeout": 0}, ENV, "engines.n8n: timeout: must be more than zero"),
        (BASE | {"timeout": "soon"}, ENV, "engines.n8n: timeout: invalid duration"),
        (BASE | {"timeout": -1}, ENV, "engines.n8n: timeout: invalid duration"),
        (BASE | {"timeout": True}, ENV, "engines.n8n: timeout: invalid duration"),
        (BASE | {"type": "zapier"}, ENV, "engines.n8n: type: unknown engine type"),
        ("http://h", ENV, "engines.n8n: expected a table"),
    ],
)
def test_config_errors_name_the_entry(table: Any, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_engine_config("n8n", table, env)
    assert str(caught.value).startswith(message), str(caught.value)


def test_config_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERACITY_TEST_N8N_KEY", raising=False)
    table = BASE | {"api_key_env": "VERACITY_TEST_N8N_KEY"}
    with pytest.raises(ConfigError, match="VERACITY_TEST_N8N_KEY is not set"):
        parse_engine_config("n8n", table)
    monkeypatch.setenv("VERACITY_TEST_N8N_KEY", "k")
    assert parse_engine_config("n8n", table).api_key == "k"


def test_parse_engines_names_each_entry() -> None:
    engines = parse_engines({"a": BASE, "b": BASE | {"stop": "public"}}, ENV)
    assert sorted(engines) == ["a", "b"]
    assert engines["b"].stop is StopMode.PUBLIC
    with pytest.raises(ConfigError, match=r"^engines\.b: api_key_env OTHER_KEY is not set"):
        parse_engines({"a": BASE, "b": BASE | {"api_key_env": "OTHER_KEY"}}, ENV)
    with pytest.raises(ConfigError, match=r"^engines: expected a table"):
        parse_engines(["n8n"], ENV)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^engines\.bad name: an engine name"):
        parse_engines({"bad name": BASE}, ENV)
