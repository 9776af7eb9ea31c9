"""``N8nEngine.inspect`` over aiohttp (the engine without a test transport) answers exactly
what the httpx path (the engine with one) answers, against the fake n8n over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from veracity._tls import ssl_context
from veracity.adapters import EngineErrorKind, Inspection, N8nEngine, StartOutcome
from veracity.core.reconcile import EngineState
from veracity.testing.fake_n8n import FakeN8n, Script, Wait, serve_asgi_in_thread

from .test_n8n import CALLBACK, config, free_port

Both = Callable[..., Awaitable[tuple[N8nEngine, N8nEngine]]]


def wire() -> httpx.AsyncHTTPTransport:
    """Plain httpx over real HTTP, with the process's one TLS context."""
    return httpx.AsyncHTTPTransport(verify=ssl_context())


@pytest.fixture
async def both(base_url: str) -> AsyncIterator[Both]:
    """``make(**config)``: (the httpx engine, the aiohttp engine), on the same config."""
    engines: list[N8nEngine] = []

    async def make(**kwargs: Any) -> tuple[N8nEngine, N8nEngine]:
        slow = N8nEngine(config(base_url, **kwargs), transport=wire())
        fast = N8nEngine(config(base_url, **kwargs))
        engines.extend((slow, fast))
        return slow, fast

    yield make
    for engine in engines:
        await engine.aclose()


async def trigger(engine: N8nEngine, fake: FakeN8n, script: Script) -> str:
    fake.queue_script("fulfil", script)
    result = await engine.start("e1", [], CALLBACK, target="/webhook/fulfil")
    assert result.outcome is StartOutcome.STARTED, result
    assert result.external_id is not None
    return result.external_id


async def same(slow: N8nEngine, fast: N8nEngine, external_id: str) -> Inspection:
    expected = await slow.inspect(external_id)
    got = await fast.inspect(external_id)
    assert got == expected
    return got


async def test_the_session_is_made_on_first_inspect_and_closed_by_aclose(
    fake: FakeN8n, base_url: str
) -> None:
    engine = N8nEngine(config(base_url))
    assert engine._aio is None
    run_id = await trigger(engine, fake, Script.forever())
    assert engine._aio is None  # start goes over httpx
    assert (await engine.inspect(run_id)).state is EngineState.RUNNING
    session = engine._aio
    assert session is not None and not session.closed
    await engine.aclose()
    assert session.closed
    with pytest.raises(RuntimeError):
        await engine.inspect(run_id)


def test_an_engine_made_outside_a_loop_makes_no_session(base_url: str) -> None:
    engine = N8nEngine(config(base_url))
    assert engine._aio is None
    asyncio.run(engine.aclose())


async def test_a_test_transport_keeps_inspect_on_httpx(both: Both, fake: FakeN8n) -> None:
    slow, _ = await both()
    run_id = await trigger(slow, fake, Script.forever())
    await slow.inspect(run_id)
    assert slow._aio is None


@pytest.mark.parametrize(
    "script",
    [
        Script.forever(),
        Script.forever(queued_for=3600),
        Script(steps=(Wait(None),), outcome="keep_running"),
        Script(steps=(Wait(30),), outcome="keep_running"),
    ],
)
async def test_running_runs(both: Both, fake: FakeN8n, script: Script) -> None:
    slow, fast = await both()
    run_id = await trigger(slow, fake, script)
    assert (await same(slow, fast, run_id)).state is EngineState.RUNNING


@pytest.mark.parametrize("outcome", ["success", "error", "crash"])
async def test_finished_runs(both: Both, fake: FakeN8n, outcome: Any) -> None:
    slow, fast = await both()
    run_id = await trigger(slow, fake, Script.forever())
    fake.finish(run_id, outcome)
    assert (await same(slow, fast, run_id)).state is EngineState.FINISHED


async def test_a_stopped_run(both: Both, fake: FakeN8n) -> None:
    slow, fast = await both()
    run_id = await trigger(slow, fake, Script.forever())
    assert (await fast.stop(run_id)).ok
    assert (await same(slow, fast, run_id)).status == "canceled"


@pytest.mark.parametrize("reported", ["unknown", "paused", "", "success", "crashed"])
async def test_odd_statuses(both: Both, fake: FakeN8n, reported: str) -> None:
    slow, fast = await both()
    run_id = await trigger(slow, fake, Script.forever())
    fake.control(run_id, report_status=reported)
    assert (await same(slow, fast, run_id)).state is EngineState.UNKNOWN


@pytest.mark.parametrize(
    "raw",
    [
        "<html>n8n</html>",
        "",
        "[1, 2]",
        '"running"',
        "{",
        "\ufeff{}",
        '{"stoppedAt": null}',
        '{"status": 3}',
        '{"status": null}',
        '{"status": "success", "stoppedAt": 1234}',
        '{"status": "waiting", "waitTill": false}',
        '{"id": "999999", "status": "success", "stoppedAt": "x"}',
        '{"id": true, "status": "running"}',
        '{"status": "running", "note": "\u00e9\u4e2d"}',
    ],
)
async def test_raw_answers(both: Both, fake: FakeN8n, raw: str) -> None:
    slow, fast = await both()
    run_id = await trigger(slow, fake, Script.forever())
    fake.control(run_id, get_raw_body=raw)
    await same(slow, fast, run_id)


async def test_the_id_as_a_json_number(both: Both, fake: FakeN8n) -> None:
    slow, fast = await both()
    run_id = await trigger(slow, fake, Script.forever())
    fake.control(run_id, get_raw_body=f'{{"id": {run_id}, "status": "running"}}')
    assert (await same(slow, fast, run_id)).state is EngineState.RUNNING


@pytest.mark.parametrize("status", [500, 502, 503, 418, 429, 403, 301])
async def test_error_statuses(both: Both, fake: FakeN8n, status: int) -> None:
    slow, fast = await both()
    run_id = await trigger(slow, fake, Script.forever())
    fake.control(run_id, get_error=status)
    inspection = await same(slow, fast, run_id)
    assert inspection.detail.startswith(str(status))


async def test_n8n_down_or_starting(both: Both, fake: FakeN8n) -> None:
    """n8n's source: 200 ``n8n is starting up. Please wait`` while it migrates; seen on a real
    n8n 1.123: then 404 ``Cannot GET /api/v1/executions/{id}`` (HTML) until its API is
    mounted. Both paths: unknown, ``not_ready``, nobody flagged."""
    slow, fast = await both()
    run_id = await trigger(slow, fake, Script.forever())
    fake.kill()
    assert (await same(slow, fast, run_id)).error is EngineErrorKind.SERVER_ERROR
    fake.start(migrating_for=60)
    migrating = await same(slow, fast, run_id)
    assert migrating.error is EngineErrorKind.NOT_READY and not migrating.needs_operator
    fake.restart(starting_for=60)
    starting = await same(slow, fast, run_id)
    assert starting.error is EngineErrorKind.NOT_READY and not starting.needs_operator
    assert f"Cannot GET /api/v1/executions/{run_id}" in starting.detail


def _answer_404(body: bytes, content_type: str | None) -> Starlette:
    async def execution(request: Request) -> Response:
        headers = {} if content_type is None else {"content-type": content_type}
        return Response(body, status_code=404, headers=headers)

    return Starlette(routes=[Route("/api/v1/executions/{id}", execution, methods=["GET"])])


@pytest.mark.parametrize(
    ("body", "content_type", "kind"),
    [
        (b'{"message": "Not Found"}', "application/json; charset=utf-8", "not_found"),
        (b'{"message":"Not Found"}', None, "not_found"),
        (b"<!DOCTYPE html><pre>Cannot GET /api/v1/executions/7</pre>", "text/html", "not_ready"),
        (b"Not Found", "text/plain", "not_ready"),
        (b"", None, "not_ready"),
        (b'"Not Found"', "application/json", "not_ready"),
        (b'{"code": 404}', "application/json", "not_ready"),
        (b'{"message": 404}', "application/json", "not_ready"),
        (b"\xff\xfe", "text/html", "not_ready"),
    ],
)
async def test_only_the_apis_own_404_means_an_unknown_id(
    body: bytes, content_type: str | None, kind: str
) -> None:
    """Seen on a real n8n 1.123: an unknown id is 404 JSON ``{"message": "Not Found"}``, the
    API's own answer (flagged: ``not_found``); the 404 it answers while starting is Express's
    HTML page. Any 404 that is not the API's JSON (HTML, text, empty, JSON of another shape)
    says nothing about the id: ``not_ready``, never flagged. Both paths agree."""
    url, stop = serve_asgi_in_thread(_answer_404(body, content_type))
    try:
        async with (
            N8nEngine(config(url), transport=wire()) as slow,
            N8nEngine(config(url)) as fast,
        ):
            inspection = await same(slow, fast, "7")
    finally:
        stop()
    assert inspection.state is EngineState.UNKNOWN
    assert inspection.error == kind
    assert inspection.needs_operator is (kind == "not_found")
    assert inspection.detail.startswith("404: ")


async def test_unknown_and_forgotten_ids(both: Both, fake: FakeN8n) -> None:
    slow, fast = await both()
    assert (await same(slow, fast, "424242")).not_found
    run_id = await trigger(slow, fake, Script.forever())
    fake.forget(run_id)
    assert (await same(slow, fast, run_id)).not_found


@pytest.mark.parametrize(
    "bad_id", ["abc", "12a", "-1", "1.5", "1/../../workflows", "a b", "%2F", "é", "1?x=2#y"]
)
async def test_odd_ids(both: Both, bad_id: str) -> None:
    slow, fast = await both()
    assert (await same(slow, fast, bad_id)).needs_operator


async def test_an_empty_id(both: Both) -> None:
    slow, fast = await both()
    assert (await same(slow, fast, "")).error is EngineErrorKind.BAD_REQUEST
    assert fast._aio is None


async def test_a_wrong_key(both: Both, fake: FakeN8n) -> None:
    slow, _ = await both()
    run_id = await trigger(slow, fake, Script.forever())
    slow, fast = await both(api_key="wrong")
    assert (await same(slow, fast, run_id)).error is EngineErrorKind.UNAUTHORIZED


@pytest.mark.parametrize("hang", [True, False])
async def test_timeouts(both: Both, fake: FakeN8n, hang: bool) -> None:
    slow, _ = await both()
    run_id = await trigger(slow, fake, Script.forever())
    if hang:
        fake.control(run_id, get_hang=True)
    else:
        fake.control(run_id, get_delay=5)
    slow, fast = await both(timeout=0.3)
    assert (await same(slow, fast, run_id)).error is EngineErrorKind.TIMEOUT


async def test_an_unreachable_port() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with N8nEngine(config(url), transport=wire()) as slow:
        expected = await slow.inspect("1")
    async with N8nEngine(config(url)) as fast:
        got = await fast.inspect("1")
    # the detail names each library's exception; everything else is the same
    assert (got.state, got.error, got.status) == (expected.state, expected.error, None)
    assert got.error is EngineErrorKind.UNREACHABLE


async def test_many_inspections_share_one_bounded_pool(fake: FakeN8n, base_url: str) -> None:
    fake.latency = 0.05
    ids = fake.start_runs("fulfil", [{"execution_id": f"e{i}"} for i in range(40)])
    async with N8nEngine(config(base_url), max_connections=8) as engine:
        loop = asyncio.get_running_loop()
        began = loop.time()
        results = await asyncio.gather(*(engine.inspect(i) for i in ids))
        took = loop.time() - began
        assert engine._aio is not None
        assert engine._aio.connector is not None and engine._aio.connector.limit == 8
    assert all(r.state is EngineState.RUNNING for r in results)
    assert 40 / 8 * 0.05 * 0.9 <= took < 40 * 0.05 / 2  # 8 at a time, not one by one
