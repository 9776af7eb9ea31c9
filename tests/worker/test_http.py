"""``ctx.http`` run by a real worker against loopback HTTP servers, on both backends
(docs/http.md): the binding's headers go on the wire with their secrets and nowhere else;
requests outside a binding (host, port, scheme, method, a redirect) or outside a step are
refused before anything is sent, and the refusal fails the step at once, naming what was
refused and the bindings there are."""

from __future__ import annotations

import asyncio
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests._echo import EchoServer, echo_server
from tests._helpers import store_fixture
from tests.durable._support import DEPLOYMENT, SETTINGS, get, history, running, submit, wait_status
from veracity import App, Context, RetryPolicy, StepFailed
from veracity.bindings import Bindings, resolve_http
from veracity.config import Settings
from veracity.core.states import Status
from veracity.store import Store
from veracity.worker.context import STEP_COMPLETED, STEP_FAILED
from veracity.worker.http import HttpClient, HttpOutsideStep, HttpRefused, step_scope
from veracity.worker.runner import Worker

app = App("tests-http")


async def fetch(http: httpx.AsyncClient, method: str, url: str,
                headers: dict[str, str] | None = None, follow: bool = False) -> dict[str, Any]:
    response = await http.request(method, url, headers=headers, follow_redirects=follow)
    return {"status": response.status_code,
            "request_headers": sorted(response.request.headers),
            "redirects": len(response.history)}


@app.workflow("test:http/fetch.run")
async def fetch_wf(ctx: Context, method: str, url: str,
                   headers: dict[str, str] | None = None, follow: bool = False) -> Any:
    return await ctx.step(fetch, ctx.http, method, url, headers, follow)


@app.workflow("test:http/refusals.run")
async def refusals(ctx: Context, calls: list[list[str]]) -> list[str]:
    out = []
    for method, url in calls:
        try:
            await ctx.step(fetch, ctx.http, method, url)
            out.append("sent")
        except StepFailed as exc:
            out.append(f"{exc.error_type}: {exc.error_message}")
    return out


@app.workflow("test:http/body.run")
async def from_the_body(ctx: Context, url: str) -> int:
    response = await ctx.http.get(url)  # not in a step: refused
    return response.status_code


_left_behind: list[tuple[asyncio.Task[Any], asyncio.Event]] = []


async def leave_a_task(http: httpx.AsyncClient, url: str) -> str:
    gate = asyncio.Event()

    async def later() -> None:
        await gate.wait()
        await http.get(url)

    _left_behind.append((asyncio.create_task(later()), gate))
    return "left"


@app.workflow("test:http/late.run")
async def late(ctx: Context, url: str) -> str:
    await ctx.step(leave_a_task, ctx.http, url)
    task, gate = _left_behind.pop()
    gate.set()  # the step has ended: its task may no longer send
    try:
        await task
    except HttpOutsideStep as exc:
        return str(exc)
    return "sent"


def fetch_from_a_thread(http: httpx.AsyncClient, url: str) -> int:
    return asyncio.run(http.get(url)).status_code


@app.workflow("test:http/sync.run")
async def from_a_thread(ctx: Context, url: str) -> int:
    result: int = await ctx.step(fetch_from_a_thread, ctx.http, url)
    return result


@app.workflow("test:http/replayed.run")
async def replayed(ctx: Context, url: str) -> Any:
    first = await ctx.step(fetch, ctx.http, "GET", url)
    await ctx.sleep(0.2)  # the execution blocks, then runs again from the top: a replay
    return first


async def cookie_then_echo(http: httpx.AsyncClient, origin: str) -> dict[str, Any]:
    await http.get(f"{origin}/cookie")
    echoed: dict[str, Any] = (await http.get(f"{origin}/after")).json()
    return echoed


@app.workflow("test:http/cookies.run")
async def cookies(ctx: Context, origin: str) -> Any:
    return await ctx.step(cookie_then_echo, ctx.http, origin)


async def echo_then_raise(http: httpx.AsyncClient, url: str) -> None:
    answer = (await http.get(url)).text  # the echo server answers with the headers it got
    raise RuntimeError(f"upstream answered: {answer}")


async def echoed(http: httpx.AsyncClient, url: str) -> Any:
    return (await http.get(url)).json()


@app.workflow("test:http/keep.run")
async def keep(ctx: Context, value: Any) -> Any:
    return value


@app.workflow("test:http/echoes.run")
async def echoes(ctx: Context, url: str) -> Any:
    """Every way an echoed secret could reach the database: a step's error (three tries),
    a step's result, a scheduled execution's params, the workflow's own error."""
    try:
        await ctx.step_with(echo_then_raise, ctx.http, url,
                            retry=RetryPolicy(max_attempts=3, initial_delay=0))
    except StepFailed:
        pass
    answer = await ctx.step(echoed, ctx.http, url)
    await ctx.schedule("test:http/keep.run", answer["headers"]["authorization"])
    raise RuntimeError(f"giving up after {answer['headers']}")


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def servers() -> Iterator[tuple[EchoServer, EchoServer, EchoServer]]:
    """a and b are bound (each with its own secret); c is not."""
    with echo_server() as a, echo_server() as b, echo_server() as c:
        yield a, b, c


@pytest.fixture
def secrets() -> dict[str, str]:
    return {"a_token": f"a-{uuid.uuid4().hex}", "b_key": f"b-{uuid.uuid4().hex}"}


@pytest.fixture
def bindings(servers: tuple[EchoServer, EchoServer, EchoServer],
             secrets: dict[str, str]) -> Bindings:
    a, b, _ = servers
    settings = Settings.model_validate({"http": [
        {"name": "service_a", "origin": a.origin, "methods": ["GET", "PUT"],
         "headers": {"Authorization": "Bearer ${secret:a_token}", "X-Client": "veracity"}},
        {"name": "service_b", "origin": b.origin, "methods": ["GET"],
         "headers": {"X-Api-Key": "${secret:b_key}"}},
    ]})
    return resolve_http(settings, {"VERACITY_SECRET_A_TOKEN": secrets["a_token"],
                                   "VERACITY_SECRET_B_KEY": secrets["b_key"]})


store = store_fixture(pool_size=4)


@pytest.fixture
async def worker(store: Store, bindings: Bindings) -> AsyncIterator[Worker]:
    w = Worker(store, app, settings=SETTINGS, deployment_id=DEPLOYMENT, http=bindings)
    async with running(w):
        yield w


async def run(store: Store, ffqn: str, *params: Any) -> Any:
    e = await submit(store, ffqn, *params)
    return await wait_status(store, e.id, Status.COMPLETED, Status.FAILED)


def described(a: EchoServer, b: EchoServer) -> str:
    return (f"the bindings are service_a (http://127.0.0.1:{a.port}: GET, PUT); "
            f"service_b (http://127.0.0.1:{b.port}: GET)")


# --- what is sent ------------------------------------------------------------------------------


async def test_the_bindings_headers_go_on_the_wire_and_nowhere_else(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
    secrets: dict[str, str],
) -> None:
    a, b, _ = servers
    done = await run(store, "test:http/fetch.run", "PUT", f"{a.origin}/v1/x")
    assert done.status == Status.COMPLETED, done.error
    [seen] = a.requests()
    assert (seen.method, seen.path) == ("PUT", "/v1/x")
    assert seen.headers["authorization"] == f"Bearer {secrets['a_token']}"
    assert seen.headers["x-client"] == "veracity"
    assert "x-api-key" not in seen.headers  # b's header stays with b
    # the request the step saw never held the headers the binding added
    assert "authorization" not in done.result["request_headers"]
    assert "x-client" not in done.result["request_headers"]

    done = await run(store, "test:http/fetch.run", "GET", f"{b.origin}/y")
    [seen] = b.requests()
    assert seen.headers["x-api-key"] == secrets["b_key"]
    assert "authorization" not in seen.headers


async def test_the_bindings_header_wins_over_the_steps_own(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
    secrets: dict[str, str],
) -> None:
    a, _, _ = servers
    done = await run(store, "test:http/fetch.run", "GET", f"{a.origin}/",
                     {"Authorization": "Bearer mine", "X-Other": "kept"})
    assert done.status == Status.COMPLETED, done.error
    [seen] = a.requests()
    assert seen.headers["authorization"] == f"Bearer {secrets['a_token']}"
    assert seen.headers["x-other"] == "kept"


async def test_a_step_is_sent_once_and_replayed_from_its_record(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, _, _ = servers
    done = await run(store, "test:http/replayed.run", f"{a.origin}/once")
    assert done.status == Status.COMPLETED, done.error
    assert done.result["status"] == 200
    events = await history(store, done.id)
    assert [e.kind for e in events].count("running") == 2  # run, block, run again
    assert len(a.requests("/once")) == 1
    [step] = [e for e in events if e.kind == STEP_COMPLETED]
    # the client is left out of the arguments' fingerprint; the rest is still compared
    assert step.data["args"] is not None


async def test_no_cookie_is_kept_between_requests(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, _, _ = servers
    done = await run(store, "test:http/cookies.run", a.origin)
    assert done.status == Status.COMPLETED, done.error
    assert "cookie" not in done.result["headers"]
    assert [s.path for s in a.requests()] == ["/cookie", "/after"]


async def test_a_redirect_to_another_binding_carries_that_bindings_headers(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
    secrets: dict[str, str],
) -> None:
    a, b, _ = servers
    done = await run(store, "test:http/fetch.run", "GET",
                     f"{a.origin}/redirect?to={b.origin}/landed", None, True)
    assert done.status == Status.COMPLETED, done.error
    assert done.result["redirects"] == 1
    [landed] = b.requests("/landed")
    assert landed.headers["x-api-key"] == secrets["b_key"]
    assert "authorization" not in landed.headers  # a's secret did not follow


# --- what is refused -------------------------------------------------------------------------


async def test_requests_outside_the_bindings_fail_their_step_at_once(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, b, c = servers
    calls = [
        ["DELETE", f"{a.origin}/v1/x"],                    # method
        ["GET", f"http://localhost:{a.port}/v1/x"],        # host
        ["GET", f"{c.origin}/v1/x"],                       # port
        ["GET", f"https://127.0.0.1:{a.port}/v1/x?q=1"],   # scheme
        ["PUT", f"{b.origin}/v1/x"],                       # b allows GET only
    ]
    done = await run(store, "test:http/refusals.run", calls)
    assert done.status == Status.COMPLETED, done.error
    bound = described(a, b)
    assert done.result == [
        f"HttpRefused: ctx.http refused DELETE {a.origin}/v1/x: binding service_a "
        f"({a.origin}) allows GET, PUT, not DELETE; {bound}",
        f"HttpRefused: ctx.http refused GET http://localhost:{a.port}/v1/x: the origin "
        f"http://localhost:{a.port} is not bound; {bound}",
        f"HttpRefused: ctx.http refused GET {c.origin}/v1/x: the origin {c.origin} is not "
        f"bound; {bound}",
        f"HttpRefused: ctx.http refused GET https://127.0.0.1:{a.port}/v1/x: the origin "
        f"https://127.0.0.1:{a.port} is not bound; {bound}",
        f"HttpRefused: ctx.http refused PUT {b.origin}/v1/x: binding service_b "
        f"({b.origin}) allows GET, not PUT; {bound}",
    ]
    # nothing reached any server, and no refused step was tried twice
    assert a.requests() == b.requests() == c.requests() == []
    failed = [e for e in await history(store, done.id) if e.kind == STEP_FAILED]
    assert [e.data["attempts"] for e in failed] == [1, 1, 1, 1, 1]
    assert {e.data["error"]["type"] for e in failed} == {"HttpRefused"}


async def test_a_redirect_out_of_the_bindings_is_refused(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, b, c = servers
    done = await run(store, "test:http/fetch.run", "GET",
                     f"{a.origin}/redirect?to={c.origin}/stolen", None, True)
    assert done.status == Status.FAILED
    message = done.error["message"]
    assert message == (
        f"step tests.worker.test_http.fetch failed: HttpRefused: ctx.http refused GET "
        f"{c.origin}/stolen: the origin {c.origin} is not bound; {described(a, b)} (reached "
        f"by a redirect from GET {a.origin}/redirect)")
    assert c.requests() == []
    assert len(a.requests("/redirect")) == 1  # the first hop went; the second did not


async def test_ctx_http_in_the_workflows_own_code_is_refused(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, _, _ = servers
    done = await run(store, "test:http/body.run", f"{a.origin}/x")
    assert done.status == Status.FAILED
    assert done.error["type"] == "HttpOutsideStep"
    assert done.error["message"] == (
        f"ctx.http refused GET {a.origin}/x: ctx.http is used outside a step; make the "
        "request in a step function (await ctx.step(fn, ctx.http, ...)), whose result is "
        "checkpointed, so that a replay does not send it again")
    assert a.requests() == []


async def test_a_task_a_step_left_behind_cannot_send_once_the_step_ended(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, _, _ = servers
    done = await run(store, "test:http/late.run", f"{a.origin}/late")
    assert done.status == Status.COMPLETED, done.error
    assert "ctx.http is used outside a step" in done.result
    assert a.requests() == []


async def test_ctx_http_from_a_threaded_step_is_refused(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, _, _ = servers
    done = await run(store, "test:http/sync.run", f"{a.origin}/x")
    assert done.status == Status.FAILED
    assert "ctx.http is an async client: use it from an async step function" in (
        done.error["message"])
    assert a.requests() == []
    [failed] = [e for e in await history(store, done.id) if e.kind == STEP_FAILED]
    assert failed.data["attempts"] == 1


async def test_no_bindings_refuses_everything(
    store: Store, servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, _, _ = servers
    async with running(Worker(store, app, settings=SETTINGS, deployment_id=DEPLOYMENT)):
        done = await run(store, "test:http/fetch.run", "GET", f"{a.origin}/x")
    assert done.status == Status.FAILED
    assert done.error["message"].endswith(
        f"ctx.http refused GET {a.origin}/x: the origin {a.origin} is not bound; no [[http]] "
        "bindings are configured (docs/http.md)")
    assert (await get(store, done.id)).attempt == 1


# --- redaction ------------------------------------------------------------------------------


async def test_a_secret_echoed_back_is_redacted_from_everything_stored(
    store: Store, worker: Worker, servers: tuple[EchoServer, EchoServer, EchoServer],
    secrets: dict[str, str],
) -> None:
    a, _, _ = servers
    done = await run(store, "test:http/echoes.run", f"{a.origin}/echo")
    assert done.status == Status.FAILED
    value, shown = secrets["a_token"], "[secret a_token]"
    # it did go out: three tries of the failing step, one of the next
    sent = a.requests("/echo")
    assert [s.headers["authorization"] for s in sent] == [f"Bearer {value}"] * 4
    events = await history(store, done.id)
    [failed] = [e for e in events if e.kind == STEP_FAILED]
    assert failed.data["attempts"] == 3
    assert f"Bearer {shown}" in failed.data["error"]["message"]
    assert f"Bearer {shown}" in failed.data["error"]["traceback"]
    [completed] = [e for e in events if e.kind == STEP_COMPLETED]
    assert completed.data["result"]["headers"]["authorization"] == f"Bearer {shown}"
    [scheduled] = [e for e in events if e.kind == "scheduled"]
    assert scheduled.data["params"] == [f"Bearer {shown}"]
    child = await get(store, uuid.UUID(scheduled.data["execution_id"]))
    assert child.params == [f"Bearer {shown}"]
    assert f"Bearer {shown}" in done.error["message"]
    everything = repr([done, child, events])
    assert value not in everything
    assert everything.count(shown) >= 6


# --- the client object -----------------------------------------------------------------------


async def test_the_client_shows_no_secret_and_stays_open(
    bindings: Bindings, secrets: dict[str, str],
) -> None:
    client = HttpClient(bindings)
    try:
        shown = repr(client)
        assert shown.startswith("<veracity HttpClient bindings: service_a (")
        for text in (shown, repr(bindings), repr(client.bindings.items)):
            assert not any(v in text for v in secrets.values()), text
        with pytest.raises(RuntimeError, match="belongs to the worker"):
            await client.aclose()
        with pytest.raises(RuntimeError, match="belongs to the worker"):
            async with client:
                pass
        assert not client.is_closed
    finally:
        await client.close_for_worker()
    assert client.is_closed
    assert issubclass(HttpOutsideStep, HttpRefused)
    assert HttpRefused.retryable is False


async def test_an_http_error_quoting_a_secret_is_raised_redacted(
    bindings: Bindings, secrets: dict[str, str], servers: tuple[EchoServer, EchoServer, EchoServer],
) -> None:
    a, _, _ = servers
    value = secrets["a_token"]

    class Quoting(httpx.AsyncBaseTransport):
        """A stand-in for the wire that quotes the header it was given in its error."""

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            try:
                raise ValueError(f"illegal header value {request.headers['authorization']!r}")
            except ValueError as exc:
                raise httpx.LocalProtocolError(f"cannot send: {exc}") from exc

    client = HttpClient(bindings)
    client._guard._wire = Quoting()  # type: ignore[assignment]
    try:
        with step_scope(), pytest.raises(httpx.LocalProtocolError) as raised:
            await client.get(f"{a.origin}/x")
    finally:
        await client.close_for_worker()
    assert str(raised.value) == ("cannot send: illegal header value 'Bearer [secret a_token]'")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert value not in "".join(traceback.format_exception(raised.value))
    assert raised.value.request.url == f"{a.origin}/x"
    assert "authorization" not in raised.value.request.headers


def test_a_context_without_a_client_says_so() -> None:
    ctx = Context.__new__(Context)
    ctx._http = None
    ctx._http_source = None
    with pytest.raises(RuntimeError, match="this context has no HTTP client"):
        ctx.http  # noqa: B018


def test_a_workers_client_is_made_when_a_workflow_first_uses_it() -> None:
    """A worker hands each context a source for its HTTP client, asked once, at the first
    ``ctx.http``: a run that never uses it never loads httpx (docs/http.md)."""
    made: list[object] = []
    client = object()

    def source() -> Any:
        made.append(client)
        return client

    ctx = Context.__new__(Context)
    ctx._http = None
    ctx._http_source = source
    assert made == []
    assert ctx.http is client and ctx.http is client
    assert made == [client]
