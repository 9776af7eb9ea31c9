"""``veracity.Client`` and ``veracity.AsyncClient`` against a live ``veracity server`` (a
real process on loopback, with its in-process worker) on both backends: every method,
typed errors carrying the API's code, waits that end and waits that time out, batches
with repeated idempotency keys inside one batch and across batches, a batch with bad
items refused whole; and a client pointed at a server that is down or does not answer."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.client.conftest import ECHO, FAIL, HOLD
from tests.test_server import VERACITY, Server, free_port, server_env
from veracity import (
    ApiError,
    AsyncClient,
    Client,
    ExecutionFailed,
    ServerUnreachable,
    Submission,
    WaitTimeout,
)
from veracity.client import (
    ConflictError,
    Forbidden,
    InvalidRequest,
    NotFoundError,
    PayloadTooLarge,
    Unauthorized,
)


def test_every_method_of_the_client(live: Server) -> None:
    with Client(live.url, timeout=5) as client:
        # submit, result, wait, get
        echoed = client.submit(ECHO, "hi", "!")
        assert echoed.status in ("pending", "running", "completed")
        assert client.result(echoed.id, timeout=20) == "hi!"
        ended = client.wait(echoed.id, timeout=5)
        assert ended.status == "completed" and ended.terminal and ended.result == "hi!"
        assert client.get(echoed.id) == ended
        # a failure: result raises with the execution's error
        failing = client.submit(FAIL, "boom")
        with pytest.raises(ExecutionFailed) as failed:
            client.result(failing.id, timeout=20)
        assert failed.value.execution.status == "failed"
        assert "boom" in str(failed.value.execution.error)
        retried = client.retry(failing.id)
        assert retried.retry_of == failing.id
        # a wait that times out answers with the current state
        held = client.submit(HOLD)
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as timed_out:
            client.wait(held.id, timeout=0.5)
        assert 0.45 <= time.monotonic() - started < 5
        assert timed_out.value.execution.status in ("pending", "running", "blocked")
        # pause and unpause, once it waits for its message; send; its result
        deadline = time.monotonic() + 20
        while client.get(held.id).status != "blocked" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.pause(held.id).status == "paused"
        assert client.unpause(held.id).status == "blocked"
        message = client.send(held.id, "go", {"ok": 1})
        assert message["topic"] == "go" and message["execution_id"] == held.id
        assert client.result(held.id, timeout=20) == {"ok": 1}
        # cancel
        other = client.submit(HOLD)
        assert client.cancel(other.id).status in ("cancelled", "running", "blocked")
        assert client.wait(other.id, timeout=20).status == "cancelled"
        # list: every page; history
        listed = list(client.list(page_size=2))
        assert {e.id for e in listed} >= {echoed.id, failing.id, held.id, other.id,
                                           retried.id}
        assert len(listed) == len({e.id for e in listed})  # no page repeated
        assert [e.id for e in client.list(status="completed", page_size=1)] == [
            held.id, echoed.id]
        kinds = [h.kind for h in client.history(echoed.id)]
        assert kinds[0] == "pending" and kinds[-1] == "completed"
        # list by creation time, each bound exclusive
        window = list(client.list(created_after=echoed.created_at,
                                  created_before=other.created_at))
        assert [e.id for e in window] == [held.id, retried.id, failing.id]
        assert [e.id for e in client.list(created_after=held.created_at)] == [other.id]
        with pytest.raises(InvalidRequest) as naive:  # a time without its offset
            list(client.list(created_after=datetime(2026, 1, 1)))
        assert naive.value.status == 422


def test_batches_and_typed_errors(live: Server) -> None:
    with Client(live.url, timeout=5) as client:
        first = client.submit_many([
            Submission(ECHO, [1], idempotency_key="a"),
            Submission(ECHO, [2]),
            {"ffqn": ECHO, "params": [1], "idempotency_key": "a"},
        ])
        assert [e.params for e in first] == [[1], [2], [1]]
        assert first[0].id == first[2].id != first[1].id
        again = client.submit_many([Submission(ECHO, [1], idempotency_key="a"),
                                    Submission(ECHO, [3], idempotency_key="b")])
        assert again[0].id == first[0].id and again[1].params == [3]
        # a dict's scheduled_at may be a datetime, as a Submission's is
        later = datetime(2099, 1, 1, tzinfo=UTC)
        (dated,) = client.submit_many([{"ffqn": ECHO, "params": [5], "scheduled_at": later}])
        assert dated.scheduled_at == later and dated.status == "pending"
        assert [client.result(e.id, timeout=20) for e in first] == [1, 2, 1]
        before = len(list(client.list()))
        with pytest.raises(InvalidRequest) as bad:
            client.submit_many([Submission(ECHO, [4]), Submission("t:client/none.run"),
                                Submission(ECHO, [])])
        assert bad.value.status == 422 and bad.value.code == "invalid_batch"
        assert [(i["index"], i["code"]) for i in bad.value.details["items"]] == [
            (1, "unknown_workflow"), (2, "invalid_params")]
        with pytest.raises(ConflictError) as conflict:
            client.submit_many([Submission(ECHO, ["other"], idempotency_key="a")])
        assert conflict.value.code == "idempotency_conflict"
        assert len(list(client.list())) == before  # nothing of either was written
        # typed errors, each with the API's code
        with pytest.raises(NotFoundError) as missing:
            client.get(str(uuid.uuid4()))
        assert missing.value.code == "not_found" and missing.value.status == 404
        with pytest.raises(InvalidRequest) as wrong:
            client.submit(ECHO)
        assert wrong.value.code == "invalid_params" and "missing value" in wrong.value.message
        with pytest.raises(ConflictError) as state:
            client.pause(first[1].id)
        assert state.value.code == "wrong_state"
        with pytest.raises(InvalidRequest) as bad_id:
            client.get("not-an-id")
        assert bad_id.value.code == "invalid_id"
        assert isinstance(bad_id.value, ApiError)
        # submitted paused: it waits until unpaused, then runs
        held_back = client.submit(ECHO, "p", "!", paused=True)
        assert held_back.status == "paused"
        with pytest.raises(WaitTimeout) as still:
            client.wait(held_back.id, timeout=0.3)
        assert still.value.execution.status == "paused"
        assert client.unpause(held_back.id).status in ("pending", "running", "completed")
        assert client.result(held_back.id, timeout=20) == "p!"
    # a token is checked when given, from the constructor or VERACITY_TOKEN
    with Client(live.url, token="vrc_not_a_real_token") as client, \
            pytest.raises(Unauthorized) as refused:
        client.get(str(uuid.uuid4()))
    assert refused.value.code == "unauthorized"


async def test_the_async_client(live: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERACITY_URL", live.url)
    async with AsyncClient(timeout=5) as client:
        echoed = await client.submit(ECHO, "x")
        assert await client.result(echoed.id, timeout=20) == "x"
        batch = await client.submit_many([Submission(ECHO, [i % 2], idempotency_key=f"k{i % 2}")
                                           for i in range(4)])
        assert batch[0].id == batch[2].id and batch[1].id == batch[3].id
        held = await client.submit(HOLD)
        with pytest.raises(WaitTimeout):
            await client.wait(held.id, timeout=0.3)
        await client.send(held.id, "go", "now")
        assert (await client.wait(held.id, timeout=20)).result == "now"
        ids = [e.id async for e in client.list(page_size=1)]
        assert set(ids) == {echoed.id, batch[0].id, batch[1].id, held.id}
        assert [h.kind for h in await client.history(held.id)][-1] == "completed"
        with pytest.raises(NotFoundError):
            await client.cancel(str(uuid.uuid4()))
        # get, a failure and its retry, pause and unpause, cancel
        assert (await client.get(echoed.id)).result == "x"
        failing = await client.submit(FAIL, "boom")
        with pytest.raises(ExecutionFailed) as failed:
            await client.result(failing.id, timeout=20)
        assert "boom" in str(failed.value.execution.error)
        failing_retry = await client.retry(failing.id)
        assert failing_retry.retry_of == failing.id
        other = await client.submit(HOLD)
        deadline = time.monotonic() + 20
        while (await client.get(other.id)).status != "blocked" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert (await client.pause(other.id)).status == "paused"
        assert (await client.unpause(other.id)).status == "blocked"
        await client.cancel(other.id)
        assert (await client.wait(other.id, timeout=20)).status == "cancelled"
        # the creation-time filters, each exclusive
        after = [e.id async for e in client.list(created_after=held.created_at)]
        assert after == [other.id, failing_retry.id, failing.id]
        before = [e.id async for e in client.list(created_before=batch[0].created_at)]
        assert before == [echoed.id]
    monkeypatch.setenv("VERACITY_TOKEN", "vrc_not_a_real_token")
    async with AsyncClient() as client:
        with pytest.raises(Unauthorized):
            await client.get(echoed.id)


async def test_many_single_submissions_at_once(live: Server) -> None:
    """Single submissions that arrive together at a real server (on uvloop) share
    transactions (docs/scaling.md, "Many submissions at once"), and each caller is
    answered as if alone: created, repeated, or its own conflict."""
    async with AsyncClient(live.url, timeout=10) as client:
        stored = await client.submit(ECHO, "kept", idempotency_key="kept")

        async def conflicting() -> str:
            with pytest.raises(ConflictError) as conflict:
                await client.submit(ECHO, "other", idempotency_key="kept")
            return conflict.value.code

        fresh, same, kept, code = await asyncio.gather(
            asyncio.gather(*(client.submit(ECHO, i) for i in range(40))),
            asyncio.gather(*(client.submit(ECHO, "same", idempotency_key="same")
                             for _ in range(5))),
            client.submit(ECHO, "kept", idempotency_key="kept"),
            conflicting(),
        )
        assert [e.params for e in fresh] == [[i] for i in range(40)]
        assert len({e.id for e in fresh}) == 40
        assert len({e.id for e in same}) == 1
        assert kept.id == stored.id and code == "idempotency_conflict"
        assert [await client.result(e.id, timeout=20) for e in fresh[:3]] == [0, 1, 2]
    metrics = httpx.get(f"{live.url}/metrics", timeout=5).text
    writes = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("veracity_submission_write_size_")}
    # 1 + 47 submissions, in fewer writes than submissions: some shared a transaction
    assert writes["veracity_submission_write_size_sum"] == 48
    assert writes["veracity_submission_write_size_count"] < 48


class _Counting(httpx.HTTPTransport):
    """The real transport, keeping each request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return super().handle_request(request)


class _AsyncCounting(httpx.AsyncHTTPTransport):
    """The same, for AsyncClient."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await super().handle_async_request(request)


def _long_polls(sent: list[httpx.Request], execution_id: str) -> list[float]:
    """The seconds each GET of the execution asked the server to wait (?wait=)."""
    return [float(r.url.params["wait"].removesuffix("s")) for r in sent
            if r.method == "GET" and r.url.path == f"/v1/executions/{execution_id}"]


def test_a_wait_is_one_long_poll_answered_when_the_execution_ends(live: Server) -> None:
    """Client.wait asks the server to hold its request (?wait=) and is answered as the
    execution ends, a second later: one request, not a loop of them."""
    counting = _Counting()
    with Client(live.url, timeout=5) as sender, \
            Client(live.url, timeout=5, transport=counting) as client:
        held = sender.submit(HOLD)
        timer = threading.Timer(1.0, sender.send, (held.id, "go", "now"))
        started = time.monotonic()
        timer.start()
        try:
            ended = client.wait(held.id, timeout=30)
        finally:
            timer.join()
        assert ended.result == "now"
        assert time.monotonic() - started >= 0.9
    (asked,) = _long_polls(counting.sent, held.id)
    assert 25 < asked <= 30


async def test_the_async_clients_wait_is_one_long_poll_too(live: Server) -> None:
    counting = _AsyncCounting()
    async with AsyncClient(live.url, timeout=5) as sender, \
            AsyncClient(live.url, timeout=5, transport=counting) as client:
        held = await sender.submit(HOLD)

        async def later() -> None:
            await asyncio.sleep(1.0)
            await sender.send(held.id, "go", "now")

        started = time.monotonic()
        ended, _ = await asyncio.gather(client.wait(held.id, timeout=30), later())
        assert ended.result == "now"
        assert time.monotonic() - started >= 0.9
    (asked,) = _long_polls(counting.sent, held.id)
    assert 25 < asked <= 30


def _read_only_token(database_url: str, tmp_path: Path) -> str:
    """A token of scope executions:read, made by `veracity token create`."""
    env = server_env(database_url, free_port())
    done = subprocess.run(
        [VERACITY, "token", "create", "--name", "reader", "--scope", "executions:read"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_the_async_clients_batches_and_typed_errors(
    live: Server, database_url: str, tmp_path: Path
) -> None:
    """As the blocking client's (test_batches_and_typed_errors), and the limits of a batch
    through the client: more than 1,000 items, a body over the payload limit (the server's
    default 1 MiB); each refused whole, nothing written."""
    async with AsyncClient(live.url, timeout=10) as client:
        first = await client.submit_many([
            Submission(ECHO, [1], idempotency_key="a"),
            Submission(ECHO, [2]),
            {"ffqn": ECHO, "params": [1], "idempotency_key": "a"},
        ])
        assert first[0].id == first[2].id != first[1].id
        again = await client.submit_many([Submission(ECHO, [1], idempotency_key="a"),
                                          Submission(ECHO, [3], idempotency_key="b")])
        assert again[0].id == first[0].id and again[1].params == [3]
        written = {e.id async for e in client.list()}
        assert len(written) == 3
        with pytest.raises(InvalidRequest) as bad:
            await client.submit_many([Submission(ECHO, [4]), Submission("t:client/none.run"),
                                      Submission(ECHO, [])])
        assert (bad.value.status, bad.value.code) == (422, "invalid_batch")
        assert [(i["index"], i["code"]) for i in bad.value.details["items"]] == [
            (1, "unknown_workflow"), (2, "invalid_params")]
        with pytest.raises(ConflictError) as conflict:
            await client.submit_many([Submission(ECHO, [5]),
                                      Submission(ECHO, ["other"], idempotency_key="a")])
        assert (conflict.value.status, conflict.value.code) == (409, "idempotency_conflict")
        with pytest.raises(PayloadTooLarge) as many:
            await client.submit_many([Submission(ECHO, [i]) for i in range(1001)])
        assert (many.value.status, many.value.code) == (413, "payload_too_large")
        assert "1,000" in many.value.message
        with pytest.raises(PayloadTooLarge) as big:  # some 1.2 MB
            await client.submit_many([Submission(ECHO, ["x" * 6000]) for _ in range(200)])
        assert (big.value.status, big.value.code) == (413, "payload_too_large")
        assert {e.id async for e in client.list()} == written  # nothing of any was written
        # typed errors, each with the API's code
        with pytest.raises(NotFoundError) as missing:
            await client.get(str(uuid.uuid4()))
        assert (missing.value.status, missing.value.code) == (404, "not_found")
        with pytest.raises(InvalidRequest) as wrong:
            await client.submit(ECHO)
        assert wrong.value.code == "invalid_params" and "missing value" in wrong.value.message
        assert (await client.wait(first[1].id, timeout=20)).status == "completed"
        with pytest.raises(ConflictError) as state:
            await client.pause(first[1].id)
        assert state.value.code == "wrong_state"
        with pytest.raises(InvalidRequest) as bad_id:
            await client.get("not-an-id")
        assert bad_id.value.code == "invalid_id"
    # a token without the route's scope: Forbidden, naming the scope
    token = _read_only_token(database_url, tmp_path)
    async with AsyncClient(live.url, token=token) as reader:
        assert (await reader.get(first[0].id)).id == first[0].id
        with pytest.raises(Forbidden) as refused:
            await reader.submit(ECHO, 1)
        assert (refused.value.status, refused.value.code) == (403, "forbidden")
        assert "executions:submit" in refused.value.message
    with Client(live.url, token=token) as blocking, pytest.raises(Forbidden):
        blocking.cancel(first[0].id)


# -- a server that is down ----------------------------------------------------------------------


def test_a_server_that_is_down_is_a_clear_exception_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Client(url, timeout=2) as client:
        started = time.monotonic()
        with pytest.raises(ServerUnreachable, match=r"GET http://127\.0\.0\.1:\d+/v1/exec"):
            client.get(str(uuid.uuid4()))
        with pytest.raises(ServerUnreachable):
            client.result(str(uuid.uuid4()), timeout=30)
        with pytest.raises(ServerUnreachable):
            client.submit_many([Submission(ECHO, [1])])
        assert time.monotonic() - started < 2  # refused: no waiting at all


def test_a_server_that_never_answers_is_given_up_after_the_timeout() -> None:
    with socket.socket() as listening:  # accepts connections, never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen(16)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        with Client(url, timeout=0.5) as client:
            started = time.monotonic()
            with pytest.raises(ServerUnreachable):
                client.submit(ECHO, 1)
            assert time.monotonic() - started < 3
            started = time.monotonic()
            with pytest.raises(ServerUnreachable):  # a long poll: its wait plus the timeout
                client.wait(str(uuid.uuid4()), timeout=1)
            assert time.monotonic() - started < 4


async def test_the_async_client_at_a_server_that_is_down_or_never_answers() -> None:
    """As the blocking client: refused at once where nothing listens; given up after its
    timeout where the server accepts and never answers (a long poll: its wait plus the
    timeout)."""
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", timeout=2) as client:
        started = time.monotonic()
        with pytest.raises(ServerUnreachable, match=r"GET http://127\.0\.0\.1:\d+/v1/exec"):
            await client.get(str(uuid.uuid4()))
        with pytest.raises(ServerUnreachable):
            await client.result(str(uuid.uuid4()), timeout=30)
        with pytest.raises(ServerUnreachable):
            await client.submit_many([Submission(ECHO, [1])])
        assert time.monotonic() - started < 2
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(16)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        async with AsyncClient(url, timeout=0.5) as client:
            started = time.monotonic()
            with pytest.raises(ServerUnreachable):
                await client.submit(ECHO, 1)
            assert time.monotonic() - started < 3
            started = time.monotonic()
            with pytest.raises(ServerUnreachable):
                await client.wait(str(uuid.uuid4()), timeout=1)
            assert time.monotonic() - started < 4


def test_a_stopping_server_answers_its_long_polls_at_once(live: Server) -> None:
    """SIGTERM: a long poll under way is answered with the execution's state then, and the
    server stops without waiting for the poll's end."""
    import signal
    import threading

    with Client(live.url, timeout=5) as client:
        later = client.submit(ECHO, "x", scheduled_at=datetime(2099, 1, 1, tzinfo=UTC))
        answers: list[object] = []

        def poll() -> None:
            try:
                answers.append(client.wait(later.id, timeout=50))
            except Exception as exc:  # the WaitTimeout or an unreachable server
                answers.append(exc)

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.5)  # the poll is under way
        started = time.monotonic()
        live.proc.send_signal(signal.SIGTERM)
        assert live.proc.wait(timeout=20) == 0, live.stderr()
        poller.join(timeout=20)
        assert time.monotonic() - started < 15
        assert not poller.is_alive()
        # answered "pending" first; the client's next poll then found no server
        assert len(answers) == 1 and isinstance(answers[0], ServerUnreachable | WaitTimeout)


async def test_the_async_clients_connections_carry_one_request_each_and_are_reused() -> None:
    """AsyncClient's lanes (veracity/client.py): at most ``limit`` requests at once, one
    per connection, connections opened only as calls need them and reused after; all
    closed by ``aclose``."""
    from veracity.client import _Lanes

    in_flight: dict[int, int] = {}
    peak = {"all": 0, "lane": 0}
    made: list[httpx.AsyncClient] = []

    def make() -> httpx.AsyncClient:
        lane = len(made)

        async def answer(request: httpx.Request) -> httpx.Response:
            in_flight[lane] = in_flight.get(lane, 0) + 1
            peak["lane"] = max(peak["lane"], in_flight[lane])
            peak["all"] = max(peak["all"], sum(in_flight.values()))
            await asyncio.sleep(0.01)
            in_flight[lane] -= 1
            return httpx.Response(200, json={"lane": lane})

        client = httpx.AsyncClient(base_url="http://veracity.test",
                                   transport=httpx.MockTransport(answer))
        made.append(client)
        return client

    lanes = _Lanes(make, limit=4)
    answers = await asyncio.gather(*(lanes.request("GET", "/x") for _ in range(20)))
    assert [a.status_code for a in answers] == [200] * 20
    assert peak == {"all": 4, "lane": 1} and len(made) == 4
    for _ in range(5):  # one after another: one connection, no new one
        await lanes.request("GET", "/x")
    assert len(made) == 4
    await lanes.aclose()
    assert all(c.is_closed for c in made)
    with pytest.raises(RuntimeError, match="has been closed"):  # as a closed httpx client
        await lanes.request("GET", "/x")
    assert len(made) == 4


async def test_a_cancelled_call_leaves_the_async_client_whole(live: Server) -> None:
    """A call cut short (cancelled by a timeout around it) at any point, even while its
    connection is being opened, leaves the client able to serve the next call: a lane
    whose request was cut short is closed, not used again (httpcore 1.0 can leave its one
    connection slot taken: encode/httpcore#1093)."""
    import random

    rng = random.Random(1)
    async with AsyncClient(live.url, timeout=2) as client:
        echoed = await client.submit(ECHO, 1)
        failed = []
        for round_ in range(40):
            try:
                await asyncio.wait_for(client.get(echoed.id), rng.uniform(0.0005, 0.01))
            except TimeoutError:
                pass
            try:
                await client.get(echoed.id)
            except ServerUnreachable as exc:
                failed.append((round_, repr(exc)))
        assert failed == []


def test_a_wait_with_a_timeout_that_is_no_duration_is_refused_before_any_request() -> None:
    """As the API refuses such a wait (invalid_wait), and as AsyncDatabaseClient does: a
    negative or NaN timeout never becomes a loop of requests."""
    sent: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    transport = httpx.MockTransport(refuse)
    with Client("http://veracity.test", transport=transport) as client:
        for bad in (-1, -0.001, float("nan"), float("-inf"), float("inf"), "5", True):
            with pytest.raises(InvalidRequest) as refused:
                client.wait("x", timeout=bad)  # type: ignore[arg-type]
            assert refused.value.code == "invalid_wait", bad
            with pytest.raises(InvalidRequest):
                client.result("x", timeout=bad)  # type: ignore[arg-type]
    assert sent == []


async def test_the_async_clients_wait_refuses_the_same_timeouts() -> None:
    sent: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    transport = httpx.MockTransport(refuse)
    async with AsyncClient("http://veracity.test", transport=transport) as client:
        for bad in (-1, float("nan")):
            with pytest.raises(InvalidRequest) as refused:
                await client.wait("x", timeout=bad)
            assert refused.value.code == "invalid_wait"
    assert sent == []


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), None, "10"])
def test_a_client_timeout_that_is_no_duration_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="timeout must be a number of seconds above 0"):
        Client("http://veracity.test", timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a number of seconds above 0"):
        AsyncClient("http://veracity.test", timeout=bad)  # type: ignore[arg-type]


def test_a_wait_answered_early_pauses_before_asking_again() -> None:
    """A server that is stopping answers its long polls at once, the execution not ended:
    the client asks again after a pause, not in a tight loop."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"id": "x", "ffqn": "a:b/c.d", "status": "running"})

    with Client("http://veracity.test", transport=httpx.MockTransport(answer)) as client:
        started = time.monotonic()
        with pytest.raises(WaitTimeout):
            client.wait("x", timeout=1.0)
        assert time.monotonic() - started >= 1.0
    assert 3 <= len(sent) <= 12, len(sent)  # about one per 0.1 s pause


def test_a_503_without_the_apis_body_is_server_busy() -> None:
    """The server refuses a connection beyond server.max_connections with a bare 503 (not
    the API's error): ServerBusy, not DatabaseUnavailable, which is the API's own 503."""
    from veracity.client import DatabaseUnavailable, ServerBusy

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/busy"):
            return httpx.Response(503, text="Service Unavailable")
        return httpx.Response(503, json={"error": {"code": "database_unavailable",
                                                   "message": "no answer"}})

    with Client("http://veracity.test", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ServerBusy) as busy:
            client.get("busy")
        assert (busy.value.status, busy.value.code) == (503, "server_busy")
        with pytest.raises(DatabaseUnavailable) as down:
            client.get("x")
        assert down.value.code == "database_unavailable"
        assert not isinstance(down.value, ServerBusy)
